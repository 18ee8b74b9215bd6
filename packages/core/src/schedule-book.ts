/**
 * The parsed schedules of one scheduler, each held once however many jobs run on it.
 *
 * @packageDocumentation
 */
import type { Cron } from 'croner';
import {
  checkFiresAfter,
  parseSchedule,
  type ScheduleOptions,
  scheduleIdentity,
} from './cron-schedule.js';
import { scheduleHash } from './ledger.js';

/** One schedule as jobs share it: croner's parse and the ledger's hash of how it is read. */
export interface BookedSchedule {
  /** The parsed schedule (its field tables shared with every other schedule's, `cron-tables.ts`). */
  readonly cron: Cron;
  /** {@link scheduleHash} of the expression, time zone and day-field rule. */
  readonly hash: string;
}

interface Entry extends BookedSchedule {
  /** A tick found after an earlier check (ms), or `-Infinity` before the first check. */
  knownTick: number;
}

/**
 * Schedules by how they are read ({@link scheduleIdentity}): jobs on one schedule share the parse,
 * the hash and the "has a tick to come" check, so that 10,000 jobs on one schedule cost 10,000
 * references rather than 10,000 parses and as many hashes and tick look-ups.
 */
export class ScheduleBook {
  private readonly entries = new Map<string, Entry>();

  /**
   * The schedule of `cron` read with `options`, parsed the first time it is asked for.
   * @throws croner's error for an invalid expression or time zone (see {@link parseSchedule}).
   */
  get(cron: string, options: ScheduleOptions): BookedSchedule {
    const id = scheduleIdentity(cron, options);
    let entry = this.entries.get(id);
    if (entry === undefined) {
      entry = {
        cron: parseSchedule(cron, options),
        hash: scheduleHash(cron, options.timezone ?? 'UTC', options.domAndDow === true),
        knownTick: Number.NEGATIVE_INFINITY,
      };
      this.entries.set(id, entry);
    }
    return entry;
  }

  /**
   * Refuses a schedule with no tick after `from` (see {@link checkFiresAfter}). A tick found
   * after an earlier `from` that is still after this one answers without asking croner again.
   * @throws LockkitError `OPTION_INVALID`
   */
  checkFiresAfter(schedule: BookedSchedule, cron: string, from: Date, job: string): void {
    const entry = schedule as Entry;
    if (entry.knownTick > from.getTime()) return;
    const next = entry.cron.nextRun(from);
    // The one look-up answers the check too: no tick is the usual OPTION_INVALID.
    checkFiresAfter({ nextRun: () => next }, cron, from, job);
    if (next !== null) entry.knownTick = next.getTime();
  }
}
