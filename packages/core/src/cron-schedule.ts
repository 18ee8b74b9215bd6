/**
 * A job's schedule as the scheduler reads it: a cron expression, a time zone (UTC unless told
 * otherwise, never the host's) and the day-field rule, answered by croner.
 *
 * @packageDocumentation
 */
import { Cron, type CronOptions } from 'croner';
import { CronMask } from './cron-mask.js';
import { shareCronTables } from './cron-tables.js';
import { LockkitError } from './errors.js';

/** The time zone a schedule is read in when none is given: UTC, whatever the host's zone. */
export const DEFAULT_TIMEZONE = 'UTC';

/** How a cron expression is read. */
export interface ScheduleOptions {
  /** IANA time zone; default {@link DEFAULT_TIMEZONE} (UTC), never the host's zone. */
  readonly timezone?: string | undefined;
  /** Both day-of-month and day-of-week must match (node-cron); default either (croner). */
  readonly domAndDow?: boolean | undefined;
}

/** croner's options, by day-field rule (index 0 for either, 1 for both) and time zone. */
const settingsByRule = [new Map<string, CronOptions>(), new Map<string, CronOptions>()] as const;

/**
 * The options object croner is given for a reading, one per rule and zone, shared by every
 * schedule read that way. croner completes its options object in place and keeps it, reading it
 * only from then on; completing a completed one sets the same values again (`cron-schedule.test.ts`
 * checks the answers, `cron-tables.test.ts` the sharing). Shared, it is not ~150 bytes a schedule.
 */
function cronSettings(options: ScheduleOptions): CronOptions {
  const timezone = options.timezone ?? DEFAULT_TIMEZONE;
  const domAndDow = options.domAndDow ?? false;
  const byZone = settingsByRule[domAndDow ? 1 : 0];
  let settings = byZone.get(timezone);
  if (settings === undefined) {
    // UTC never changes its offset: croner's fixed-offset path gives the same ticks by plain
    // arithmetic, where a named zone formats dates through Intl (whose first use alone maps ~8 MB
    // of ICU data into the process). cron-schedule.test.ts checks the ticks are the same.
    const utc = timezone === 'UTC' || timezone === 'Etc/UTC';
    const named: { [K in keyof CronOptions]?: CronOptions[K] | undefined } = {
      paused: true,
      domAndDow,
      timezone: utc ? undefined : timezone,
      utcOffset: utc ? 0 : undefined,
      // croner fills in the rest of its options on this object: named here (its defaults come
      // for undefined), they have room in the object instead of a second one.
      legacyMode: undefined,
      maxRuns: undefined,
      catch: undefined,
      unref: undefined,
      mode: undefined,
      alternativeWeekdays: undefined,
      sloppyRanges: undefined,
      fixedTimeRule: undefined,
      allowPast: undefined,
      interval: undefined,
      dayOffset: undefined,
    };
    settings = named as CronOptions;
    byZone.set(timezone, settings);
  }
  return settings;
}

/**
 * How many schedules keep croner's parse between two look-ups: the most recently asked. A parse
 * held costs about 600 bytes (croner's `Cron`, its state and pattern objects; the field tables are
 * shared, `cron-tables.ts`); 10,000 distinct schedules all held cost 6 MB. One not held is parsed
 * again when its next tick is asked, about 50–80 µs in UTC: once per tick, next to the tick's own
 * database transaction.
 */
export const RECENT_PARSES = 256;

/** croner's parses of the {@link RECENT_PARSES} schedules asked last, oldest first. */
const recent = new Map<CronSchedule, Cron>();

/** How many times this process has had croner parse an expression: for tests and probes. */
let cronerParses = 0;

/** How many croner parses this process has made so far (see {@link CronMask}): for tests and probes. */
export function cronerParseCount(): number {
  return cronerParses;
}

/** croner's parse of `expression`, its field tables replaced by the shared ones. */
function parse(expression: string, settings: CronOptions): Cron {
  cronerParses++;
  const parsed = new Cron(expression, settings);
  shareCronTables(parsed);
  return parsed;
}

/**
 * A parsed schedule as the scheduler holds it, once however many jobs run on it: the expression
 * and how it is read, and its last answer. A plain expression in UTC (numbers, `*`, ranges, steps,
 * lists) answers its next tick from its {@link CronMask}, croner's answer by arithmetic, with no
 * croner parse at all; croner computes every other answer, and its parse is held only for the
 * schedules asked recently ({@link RECENT_PARSES}) and made again for the others, so that a
 * schedule costs a few dozen bytes, not croner's objects.
 *
 * Read by croner, it remembers its last answer to `nextRun(after)`: tick T, the first after
 * `after`, is also the first after any instant in [after, T). The 10,000 jobs of one schedule,
 * each asking from a slightly later instant as they are registered and started, then cost one
 * look-up (croner's look-ups in a named zone each format dates through `Intl`). Its masks answer
 * without allocating, so a masked schedule remembers nothing (two boxed numbers less each).
 */
export class CronSchedule {
  /** croner's last answer (ms; NaN for none) and the `after` it was asked from. */
  private remembered: { readonly after: number; readonly answer: number } | undefined;

  /** Use {@link parseSchedule}, which checks the expression and the zone. */
  constructor(
    /** The cron expression, as given. */
    readonly expression: string,
    private readonly settings: CronOptions,
    /** The expression as bit masks, when it is a plain one read in UTC (see {@link CronMask}). */
    private readonly mask?: CronMask,
  ) {}

  /** The first tick strictly after `after`, or `null` when there is none (croner's answer). */
  nextRun(after: Date): Date | null {
    const from = after.getTime();
    // The masks count years as Date.UTC does: from 1970 on, croner's answer (cron-mask.test.ts).
    if (this.mask !== undefined && from >= 0) {
      const next = this.mask.nextAfter(from);
      return next === null ? null : new Date(next);
    }
    const last = this.remembered;
    // Comparisons with NaN are false: no tick remembered asks again.
    if (last !== undefined && from >= last.after && from < last.answer)
      return new Date(last.answer);
    return this.ask(this.cron(), after);
  }

  /** croner's next tick after `after` by `parsed`, remembered. */
  private ask(parsed: Cron, after: Date): Date | null {
    const next = parsed.nextRun(after);
    this.remembered = {
      after: after.getTime(),
      answer: next === null ? Number.NaN : next.getTime(),
    };
    return next;
  }

  /**
   * A schedule whose first look-up, the tick after `from`, is answered by the parse at hand and
   * remembered; the parse is then let go, not held among the recent ones. A scheduler registering
   * 10,000 distinct schedules asks each this one question: their parses die young, instead of
   * living on among the recent ones long enough to be moved to V8's old generation and leave it
   * fragmented (RSS) once dropped.
   */
  static firstAsked(
    expression: string,
    settings: CronOptions,
    parsed: Cron,
    from: Date,
  ): CronSchedule {
    const schedule = new CronSchedule(expression, settings);
    schedule.ask(parsed, from);
    return schedule;
  }

  /** The next `n` ticks strictly after `previous` (croner's `nextRuns`). */
  nextRuns(n: number, previous: Date): Date[] {
    return this.cron().nextRuns(n, previous);
  }

  /** The `n` ticks strictly before `reference`, newest first (croner's `previousRuns`). */
  previousRuns(n: number, reference: Date): Date[] {
    return this.cron().previousRuns(n, reference);
  }

  /**
   * croner's parse of this schedule: the one held if it was asked recently, else a new one, which
   * is then held in place of the parse asked longest ago.
   */
  cron(): Cron {
    const held = recent.get(this);
    if (held !== undefined) recent.delete(this); // back in at the newest end
    const parsed = held ?? parse(this.expression, this.settings);
    hold(this, parsed);
    return parsed;
  }
}

/** How many croner parses are held in this process (at most {@link RECENT_PARSES}): for tests and probes. */
export function heldParseCount(): number {
  return recent.size;
}

/** Holds `parsed` as the newest of the recent parses, letting the oldest go when there are too many. */
function hold(schedule: CronSchedule, parsed: Cron): void {
  if (recent.size >= RECENT_PARSES) {
    const oldest = recent.keys().next();
    if (oldest.done !== true) recent.delete(oldest.value);
  }
  recent.set(schedule, parsed);
}

/**
 * Parses a schedule, paused (the scheduler times its ticks itself), in the given time zone or UTC.
 * A plain expression in UTC is read into a {@link CronMask} without croner (whose every parse
 * allocates an ~80 KB year table, garbage at once but 800 MB of it for 10,000 distinct
 * schedules). Another is parsed by croner, which answers (and remembers) its first tick after
 * `from` (so an impossible zone throws here), then let go: its field
 * tables are shared with every other schedule's equal ones (`cron-tables.ts`), and croner's parse
 * is held only while the schedule is among those asked recently, not from this parse on. A
 * distinct schedule costs a few dozen bytes, not croner's ~82 KB, nor its ~600 bytes once tables
 * are shared.
 * @throws croner's error for an invalid expression or time zone (an impossible zone shows only
 * when a tick is computed, which this does once).
 */
export function parseSchedule(
  cron: string,
  options: ScheduleOptions,
  from: Date = new Date(),
): CronSchedule {
  const settings = cronSettings(options);
  const timezone = options.timezone ?? DEFAULT_TIMEZONE;
  if (timezone === 'UTC' || timezone === 'Etc/UTC') {
    const mask = CronMask.read(cron, options.domAndDow ?? false);
    // Its look-ups cost no parse: nothing to answer ahead (the caller asks what it needs).
    if (mask !== undefined) return new CronSchedule(cron, settings, mask);
  }
  return CronSchedule.firstAsked(cron, settings, parse(cron, settings), from);
}

/**
 * The schedule of a plain UTC expression already read into `mask` (a row of a scheduler's table
 * of schedules, `schedule-book.ts`): what {@link parseSchedule} answers for it, made on demand.
 */
export function maskedSchedule(cron: string, domAndDow: boolean, mask: CronMask): CronSchedule {
  return new CronSchedule(cron, cronSettings({ domAndDow }), mask);
}

/**
 * Refuses a schedule with no tick after `from`: one that can never fire (`0 0 0 30 2 *`,
 * `0 0 0 31 4 *`) or whose last tick is past (a 7-field expression with a past year).
 * @throws LockkitError `OPTION_INVALID`
 */
export function checkFiresAfter(
  schedule: Pick<CronSchedule, 'nextRun'>,
  cron: string,
  from: Date,
  job: string,
): void {
  if (schedule.nextRun(from) === null) throw noTickError(cron, from, job);
}

/** The error of {@link checkFiresAfter}: `cron` has no tick after `from`. */
export function noTickError(cron: string, from: Date, job: string): LockkitError {
  return new LockkitError(
    'OPTION_INVALID',
    `job "${job}": "${cron}" has no tick after ${from.toISOString()}: it would never run.`,
  );
}
