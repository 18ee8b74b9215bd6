/**
 * The smallest gap between consecutive ticks of a schedule, which bounds its `jitterMs`.
 *
 * @packageDocumentation
 */

/** How many upcoming ticks {@link minimumGapMs} looks at: over two years of a daily job, DST included. */
export const GAP_SAMPLE_RUNS = 1000;

/** What {@link minimumGapMs} needs of a schedule: croner's `nextRuns`. */
export interface GapSchedule {
  nextRuns(n: number, previous?: Date): Date[];
}

/**
 * The smallest gap, in ms, between consecutive ticks among the next `runs` after `from`;
 * `Infinity` when fewer than two ticks are left.
 */
export function minimumGapMs(schedule: GapSchedule, from: Date, runs = GAP_SAMPLE_RUNS): number {
  const ticks = schedule.nextRuns(runs, from);
  let gap = Number.POSITIVE_INFINITY;
  for (let i = 1; i < ticks.length; i++) {
    gap = Math.min(gap, (ticks[i] as Date).getTime() - (ticks[i - 1] as Date).getTime());
  }
  return gap;
}
