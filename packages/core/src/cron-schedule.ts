/**
 * A job's schedule as the scheduler reads it: a cron expression, a time zone (UTC unless told
 * otherwise, never the host's) and the day-field rule, parsed once by croner.
 *
 * @packageDocumentation
 */
import { Cron } from 'croner';
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
 * A key equal for two schedules exactly when they are read the same way: the expression, the time
 * zone (an omitted one is UTC) and the day-field rule (which changes which ticks exist).
 */
export function scheduleIdentity(cron: string, options: ScheduleOptions): string {
  return `${options.timezone ?? DEFAULT_TIMEZONE}\u0000${options.domAndDow ?? false}\u0000${cron}`;
}

/**
 * Parses a schedule, paused (the scheduler times its ticks itself), in the given time zone or UTC.
 * @throws croner's error for an invalid expression or time zone (an impossible zone shows only
 * when a tick is computed, which this does once).
 */
export function parseSchedule(cron: string, options: ScheduleOptions): Cron {
  const parsed = new Cron(cron, {
    paused: true,
    domAndDow: options.domAndDow ?? false,
    timezone: options.timezone ?? DEFAULT_TIMEZONE,
  });
  parsed.nextRun();
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
