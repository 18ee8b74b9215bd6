/**
 * The parsed schedules of one scheduler, each held once however many jobs run on it.
 *
 * @packageDocumentation
 */
import {
  type CronSchedule,
  DEFAULT_TIMEZONE,
  parseSchedule,
  type ScheduleOptions,
} from './cron-schedule.js';
import { scheduleHash } from './ledger.js';

/** One schedule as jobs share it: the parsed schedule and the ledger's hash of how it is read. */
export interface BookedSchedule {
  /** The parsed schedule (croner's parse held only while asked recently, `cron-schedule.ts`). */
  readonly cron: CronSchedule;
  /** {@link scheduleHash} of the expression, time zone and day-field rule. */
  readonly hash: string;
}

/**
 * Schedules by how they are read: the day-field rule, the time zone (an omitted one is UTC) and
 * the expression. Jobs on one schedule share its parse and its hash, so that 10,000 jobs on one
 * schedule cost 10,000 references rather than 10,000 parses and hashes. The look-up goes through
 * nested maps keyed by the strings the caller already holds, so no key string is built and kept.
 */
export class ScheduleBook {
  /** By `domAndDow` (index 0 for false, 1 for true), then time zone, then expression. */
  private readonly byRule = [
    new Map<string, Map<string, BookedSchedule>>(),
    new Map<string, Map<string, BookedSchedule>>(),
  ] as const;

  /**
   * The schedule of `cron` read with `options`, parsed the first time it is asked for, when its
   * first tick after `from` is looked up and remembered (the registering job asks just that).
   * @throws croner's error for an invalid expression or time zone (see {@link parseSchedule}).
   */
  get(cron: string, options: ScheduleOptions, from: Date): BookedSchedule {
    const domAndDow = options.domAndDow === true;
    const timezone = options.timezone ?? DEFAULT_TIMEZONE;
    const byZone = this.byRule[domAndDow ? 1 : 0];
    let byCron = byZone.get(timezone);
    let booked = byCron?.get(cron);
    if (booked === undefined) {
      booked = {
        cron: parseSchedule(cron, options, from),
        hash: scheduleHash(cron, timezone, domAndDow),
      };
      if (byCron === undefined) {
        byCron = new Map();
        byZone.set(timezone, byCron);
      }
      byCron.set(cron, booked);
    }
    return booked;
  }
}
