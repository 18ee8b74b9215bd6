/**
 * A job's schedule as the scheduler reads it: a cron expression, a time zone (UTC unless told
 * otherwise, never the host's) and the day-field rule, parsed once by croner.
 *
 * @packageDocumentation
 */
import { Cron, type CronOptions } from 'croner';
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

/**
 * A croner `Cron` that remembers its last answer to `nextRun(after)`: tick T, the first after
 * `after`, is also the first after any instant in [after, T). The 10,000 jobs of one schedule,
 * each asking from a slightly later instant as they are registered and started, then cost one
 * look-up (croner's look-ups in a named zone each format dates through `Intl`, which is what
 * filled memory while a large scheduler started), and the answers are croner's own.
 */
class RememberingCron extends Cron {
  /** The `after` of the remembered look-up (ms), or NaN when none is. */
  private askedAfter = Number.NaN;
  /** Its answer (ms), or NaN when the schedule has no tick after `askedAfter`. */
  private answer = Number.NaN;

  override nextRun(prev?: Parameters<Cron['nextRun']>[0]): Date | null {
    if (!(prev instanceof Date)) return super.nextRun(prev);
    const after = prev.getTime();
    // Comparisons with NaN are false: nothing remembered, or no tick, asks croner.
    if (after >= this.askedAfter && after < this.answer) return new Date(this.answer);
    const next = super.nextRun(prev);
    this.askedAfter = after;
    this.answer = next === null ? Number.NaN : next.getTime();
    return next;
  }
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
 * Parses a schedule, paused (the scheduler times its ticks itself), in the given time zone or UTC.
 * Its field tables are shared with every other schedule's equal ones (`cron-tables.ts`): a
 * distinct schedule costs about a kilobyte, not croner's ~82 KB.
 * @throws croner's error for an invalid expression or time zone (an impossible zone shows only
 * when a tick is computed, which this does once).
 */
export function parseSchedule(cron: string, options: ScheduleOptions): Cron {
  const parsed = new RememberingCron(cron, cronSettings(options));
  parsed.nextRun();
  shareCronTables(parsed);
  return parsed;
}

/**
 * Refuses a schedule with no tick after `from`: one that can never fire (`0 0 0 30 2 *`,
 * `0 0 0 31 4 *`) or whose last tick is past (a 7-field expression with a past year).
 * @throws LockkitError `OPTION_INVALID`
 */
export function checkFiresAfter(
  schedule: Pick<Cron, 'nextRun'>,
  cron: string,
  from: Date,
  job: string,
): void {
  if (schedule.nextRun(from) === null) {
    throw new LockkitError(
      'OPTION_INVALID',
      `job "${job}": "${cron}" has no tick after ${from.toISOString()}: it would never run.`,
    );
  }
}
