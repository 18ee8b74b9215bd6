/**
 * The smallest gap between consecutive ticks of a schedule, which bounds its `jitterMs`.
 *
 * The next {@link GAP_SAMPLE_RUNS} ticks are looked at, and the ticks around every change of the
 * time zone's UTC offset (DST) in the next {@link GAP_HORIZON_MS}: a DST change shortens a gap
 * only between the ticks on either side of it, so a fast schedule needs no full year of ticks.
 *
 * @packageDocumentation
 */

/** How many upcoming ticks {@link minimumGapMs} looks at, from the start. */
export const GAP_SAMPLE_RUNS = 1000;

/** How far ahead {@link minimumGapMs} looks for DST changes: a year and a day, both changes. */
export const GAP_HORIZON_MS = 366 * 86_400_000;

/** Ticks looked at on each side of an offset change. */
const AROUND_CHANGE = 4;

const DAY_MS = 86_400_000;

/** What {@link minimumGapMs} needs of a schedule: croner's `nextRuns` and `previousRuns`. */
export interface GapSchedule {
  nextRuns(n: number, previous?: Date): Date[];
  previousRuns(n: number, reference?: Date): Date[];
}

const formats = new Map<string, Intl.DateTimeFormat>();

/** The zone's UTC offset at `at`, in ms. */
function offsetMs(timezone: string, at: number): number {
  let format = formats.get(timezone);
  if (format === undefined) {
    format = new Intl.DateTimeFormat('en-US', {
      timeZone: timezone,
      hourCycle: 'h23',
      year: 'numeric',
      month: 'numeric',
      day: 'numeric',
      hour: 'numeric',
      minute: 'numeric',
      second: 'numeric',
    });
    formats.set(timezone, format);
  }
  const part: Record<string, number> = {};
  for (const p of format.formatToParts(at)) part[p.type] = Number(p.value);
  const wall = Date.UTC(
    part.year ?? 0,
    (part.month ?? 1) - 1,
    part.day ?? 1,
    part.hour ?? 0,
    part.minute ?? 0,
    part.second ?? 0,
  );
  return wall - (at - (at % 1000));
}

/**
 * The instants in (from, to] at which the zone's UTC offset changes, to the second (sampled
 * daily: no zone changes its offset twice within a day).
 */
export function offsetChanges(timezone: string, from: number, to: number): number[] {
  if (timezone === 'UTC' || timezone === 'Etc/UTC') return [];
  const changes: number[] = [];
  let previous = from;
  let offset = offsetMs(timezone, from);
  while (previous < to) {
    const next = Math.min(previous + DAY_MS, to);
    const nextOffset = offsetMs(timezone, next);
    if (nextOffset !== offset) {
      let low = previous;
      let high = next;
      while (high - low > 1000) {
        const mid = low + Math.floor((high - low) / 2);
        if (offsetMs(timezone, mid) === offset) low = mid;
        else high = mid;
      }
      changes.push(high);
      offset = nextOffset;
    }
    previous = next;
  }
  return changes;
}

/** The smallest difference between consecutive instants of sorted, distinct `ticks`. */
function smallestGap(ticks: readonly number[]): number {
  let gap = Number.POSITIVE_INFINITY;
  for (let i = 1; i < ticks.length; i++)
    gap = Math.min(gap, (ticks[i] as number) - (ticks[i - 1] as number));
  return gap;
}

/**
 * The smallest gap, in ms, between consecutive ticks after `from`: among the next `runs`, and
 * around each DST change of `timezone` within {@link GAP_HORIZON_MS}; `Infinity` when fewer than
 * two ticks are left.
 */
export function minimumGapMs(
  schedule: GapSchedule,
  from: Date,
  timezone = 'UTC',
  runs = GAP_SAMPLE_RUNS,
): number {
  const start = from.getTime();
  let gap = smallestGap(schedule.nextRuns(runs, from).map((d) => d.getTime()));
  for (const change of offsetChanges(timezone, start, start + GAP_HORIZON_MS)) {
    const around = new Set<number>();
    for (const d of schedule.previousRuns(AROUND_CHANGE, new Date(change))) around.add(d.getTime());
    for (const d of schedule.nextRuns(AROUND_CHANGE, new Date(change - 1))) around.add(d.getTime());
    const ticks = [...around].filter((t) => t > start).sort((a, b) => a - b);
    gap = Math.min(gap, smallestGap(ticks));
  }
  return gap;
}
