/**
 * A job's schedule as the scheduler reads it: a cron expression, a time zone and the day-field
 * rule, parsed once by croner.
 *
 * @packageDocumentation
 */
import { Cron } from 'croner';

/** How a cron expression is read. */
export interface ScheduleOptions {
  /** IANA time zone; default UTC. */
  readonly timezone?: string | undefined;
  /** Both day-of-month and day-of-week must match (node-cron); default either (croner, Vixie). */
  readonly domAndDow?: boolean | undefined;
}

/**
 * A key equal for two schedules exactly when they are read the same way: the expression, the time
 * zone and the day-field rule (which changes which ticks exist).
 */
export function scheduleIdentity(cron: string, options: ScheduleOptions): string {
  return `${options.timezone ?? ''}\u0000${options.domAndDow ?? false}\u0000${cron}`;
}

/**
 * Parses a schedule, paused (the scheduler times its ticks itself).
 * @throws croner's error for an invalid expression or time zone (an impossible zone shows only
 * when a tick is computed, which this does once).
 */
export function parseSchedule(cron: string, options: ScheduleOptions): Cron {
  const parsed = new Cron(cron, {
    paused: true,
    domAndDow: options.domAndDow ?? false,
    ...(options.timezone !== undefined && { timezone: options.timezone }),
  });
  parsed.nextRun();
  return parsed;
}
