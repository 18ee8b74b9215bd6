/**
 * The schedules of one scheduler as rows of one table, each held once however many jobs run on
 * it: a schedule is a number, its row's masks and hash are words of typed arrays.
 *
 * @packageDocumentation
 */
import { CronMask, MASK_WORDS, maskDomAndDow, maskNextAfter, readMaskInto } from './cron-mask.js';
import {
  type CronSchedule,
  DEFAULT_TIMEZONE,
  maskedSchedule,
  parseSchedule,
  RECENT_PARSES,
  type ScheduleOptions,
} from './cron-schedule.js';
import { scheduleHashText, writeScheduleHash } from './ledger.js';

/** Rows the table starts with; it doubles when full. */
const FIRST_ROWS = 16;

/**
 * Schedules by how they are read: the day-field rule, the time zone (an omitted one is UTC) and
 * the expression. Jobs on one schedule share its row, so that 10,000 jobs on one schedule cost
 * 10,000 numbers rather than 10,000 parses and hashes.
 *
 * 10,000 distinct schedules were 10,000 object graphs (a `CronSchedule`, its `CronMask`, a booked
 * entry and a 16-character hash: ~290 bytes each). Whatever a scheduler keeps is first allocated
 * in V8's young generation and copied out of it, and those bytes, counted about twice, grew the
 * young generation's semi-spaces to 8 MB and then 16 MB: most of the process's peak resident set
 * (docs/performance.md). A plain UTC expression (the most common) is now a row of
 * {@link MASK_WORDS} words in one `Int32Array` and its hash two words in another, both off V8's
 * heap; the expression string is the caller's, held in one array. Only an expression croner must
 * read (a named zone, `L`, `W`, `#`, a year) keeps a {@link CronSchedule} of its own.
 */
export class ScheduleBook {
  /** By `domAndDow` (index 0 for false, 1 for true), then time zone, then expression: the row. */
  private readonly byRule = [
    new Map<string, Map<string, number>>(),
    new Map<string, Map<string, number>>(),
  ] as const;
  /** Each row's expression, as given. */
  private readonly expressions: string[] = [];
  /** Each row's masks ({@link MASK_WORDS} words), when it is a plain UTC expression. */
  private masks = new Int32Array(FIRST_ROWS * MASK_WORDS);
  /** Each row's {@link scheduleHash}, as two words. */
  private hashes = new Int32Array(FIRST_ROWS * 2);
  /** 1 for a row read into masks, 0 for one croner reads. */
  private masked = new Uint8Array(FIRST_ROWS);
  /** The schedules croner reads, by row: few, and each keeps its remembered answer. */
  private readonly cronerRead = new Map<number, CronSchedule>();
  /**
   * Schedules made for masked rows lately asked for (see {@link ScheduleBook.schedule}), newest
   * last, at most {@link RECENT_PARSES}: a job's ticks ask its schedule for croner's
   * `previousRuns`, and croner's parse is held by the schedule object that asked.
   */
  private readonly views = new Map<number, CronSchedule>();

  /** How many schedules are booked. */
  get size(): number {
    return this.expressions.length;
  }

  /**
   * The row of `cron` read with `options`, read the first time it is asked for (croner answers,
   * and remembers, the first tick after `from` of an expression it reads).
   * @throws croner's error for an invalid expression or time zone (see {@link parseSchedule}).
   */
  book(cron: string, options: ScheduleOptions, from: Date): number {
    const domAndDow = options.domAndDow === true;
    const timezone = options.timezone ?? DEFAULT_TIMEZONE;
    const byZone = this.byRule[domAndDow ? 1 : 0];
    let byCron = byZone.get(timezone);
    const booked = byCron?.get(cron);
    if (booked !== undefined) return booked;
    const row = this.expressions.length;
    this.room(row + 1);
    const utc = timezone === 'UTC' || timezone === 'Etc/UTC';
    if (utc && readMaskInto(cron, domAndDow, this.masks, row * MASK_WORDS)) {
      this.masked[row] = 1;
    } else {
      this.cronerRead.set(row, parseSchedule(cron, options, from));
      this.masked[row] = 0;
    }
    writeScheduleHash(cron, timezone, domAndDow, this.hashes, row * 2);
    this.expressions.push(cron);
    if (byCron === undefined) {
      byCron = new Map();
      byZone.set(timezone, byCron);
    }
    byCron.set(cron, row);
    return row;
  }

  /** The expression of `row`, as given. */
  expression(row: number): string {
    return this.expressions[row] as string;
  }

  /** The {@link scheduleHash} of `row`: made when asked, not kept. */
  hash(row: number): string {
    return scheduleHashText(this.hashes, row * 2);
  }

  /**
   * The first tick of `row` strictly after `after` (ms), NaN when there is none: croner's answer,
   * by arithmetic on the row's masks when it has them (nothing allocated that is kept).
   */
  nextRun(row: number, after: number): number {
    if (this.masked[row] === 1 && after >= 0)
      return maskNextAfter(this.masks, row * MASK_WORDS, after);
    const next = this.schedule(row).nextRun(new Date(after));
    return next === null ? Number.NaN : next.getTime();
  }

  /**
   * `row` as a {@link CronSchedule}: its own for an expression croner reads, else one made for the
   * row's masks and kept among the {@link RECENT_PARSES} asked for last.
   */
  schedule(row: number): CronSchedule {
    const own = this.cronerRead.get(row);
    if (own !== undefined) return own;
    let view = this.views.get(row);
    if (view !== undefined)
      this.views.delete(row); // back in at the newest end
    else {
      if (this.views.size >= RECENT_PARSES) {
        const oldest = this.views.keys().next();
        if (oldest.done !== true) this.views.delete(oldest.value);
      }
      const at = row * MASK_WORDS;
      const mask = CronMask.at(this.masks, at);
      view = maskedSchedule(this.expression(row), maskDomAndDow(this.masks, at), mask);
    }
    this.views.set(row, view);
    return view;
  }

  /** Grows the typed columns to hold `rows` rows, doubling. */
  private room(rows: number): void {
    if (rows <= this.masked.length) return;
    let size = this.masked.length;
    while (size < rows) size *= 2;
    const masks = new Int32Array(size * MASK_WORDS);
    masks.set(this.masks);
    this.masks = masks;
    const hashes = new Int32Array(size * 2);
    hashes.set(this.hashes);
    this.hashes = hashes;
    const masked = new Uint8Array(size);
    masked.set(this.masked);
    this.masked = masked;
  }
}
