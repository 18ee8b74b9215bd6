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
import { StringTable } from './string-table.js';

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
 * {@link MASK_WORDS} words in one `Int32Array` and its hash two words in another, its expression
 * code units in a {@link StringTable}, all off V8's heap; the caller's string is not kept. Only an
 * expression croner must read (a named zone, `L`, `W`, `#`, a year) keeps a {@link CronSchedule}
 * of its own.
 */
export class ScheduleBook {
  /** Each row's expression, as given, kept as code units (see {@link StringTable}). */
  private readonly expressions = new StringTable();
  /** The time zones read in, by number (few), and their numbers. */
  private readonly zones: string[] = [];
  private readonly zoneNumbers = new Map<string, number>();
  /** Each row's reading: its zone's number times two, plus one for `domAndDow`. */
  private readings = new Int32Array(FIRST_ROWS);
  /**
   * The rows by reading and expression: open addressing over a hash of both, a slot holding its
   * row plus one (0 for empty). Not a map of the caller's strings: those would be kept.
   */
  private slots = new Int32Array(FIRST_ROWS * 2);
  /** Each row's hash in the slots, kept so that growing them makes no string. */
  private rowHashes = new Int32Array(FIRST_ROWS);
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
    return this.expressions.size;
  }

  /**
   * The row of `cron` read with `options`, read the first time it is asked for (croner answers,
   * and remembers, the first tick after `from` of an expression it reads).
   * @throws croner's error for an invalid expression or time zone (see {@link parseSchedule}).
   */
  book(cron: string, options: ScheduleOptions, from: Date): number {
    const domAndDow = options.domAndDow === true;
    const timezone = options.timezone ?? DEFAULT_TIMEZONE;
    let zone = this.zoneNumbers.get(timezone);
    if (zone === undefined) {
      zone = this.zones.push(timezone) - 1;
      this.zoneNumbers.set(timezone, zone);
    }
    const reading = zone * 2 + (domAndDow ? 1 : 0);
    const hash = StringTable.hash(cron, Math.imul(reading + 1, 0x9e3779b1));
    const mask = this.slots.length - 1;
    let slot = hash & mask;
    for (; ; slot = (slot + 1) & mask) {
      const booked = (this.slots[slot] as number) - 1;
      if (booked < 0) break;
      if (this.readings[booked] === reading && this.expressions.equals(booked, cron)) return booked;
    }
    const row = this.expressions.size;
    const utc = timezone === 'UTC' || timezone === 'Etc/UTC';
    this.room(row + 1);
    if (utc && readMaskInto(cron, domAndDow, this.masks, row * MASK_WORDS)) {
      this.masked[row] = 1;
    } else {
      // Throws for an expression croner refuses: nothing is booked then.
      this.cronerRead.set(row, parseSchedule(cron, options, from));
      this.masked[row] = 0;
    }
    writeScheduleHash(cron, timezone, domAndDow, this.hashes, row * 2);
    this.readings[row] = reading;
    this.rowHashes[row] = hash;
    this.expressions.add(cron);
    this.index(row, hash);
    return row;
  }

  /** Puts `row`, whose reading and expression hash to `hash`, in the slots, growing them. */
  private index(row: number, hash: number): void {
    if (2 * (row + 1) > this.slots.length) {
      this.slots = new Int32Array(this.slots.length * 2);
      for (let other = 0; other < row; other++) this.place(other, this.rowHashes[other] as number);
    }
    this.place(row, hash);
  }

  private place(row: number, hash: number): void {
    const mask = this.slots.length - 1;
    let slot = hash & mask;
    while (this.slots[slot] !== 0) slot = (slot + 1) & mask;
    this.slots[slot] = row + 1;
  }

  /** The expression of `row`, as given. */
  expression(row: number): string {
    return this.expressions.get(row);
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
    const readings = new Int32Array(size);
    readings.set(this.readings);
    this.readings = readings;
    const rowHashes = new Int32Array(size);
    rowHashes.set(this.rowHashes);
    this.rowHashes = rowHashes;
  }
}
