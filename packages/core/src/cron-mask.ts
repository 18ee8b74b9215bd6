/**
 * A plain cron expression read in UTC as a handful of bit masks, and its next tick by arithmetic:
 * what the scheduler uses instead of a croner parse for the expressions most schedules are.
 *
 * croner 11 builds a `CronPattern` of per-field tables at every parse, among them a 10,000-entry
 * year table (~80 KB). Sharing the tables afterwards (`cron-tables.ts`) keeps that from being held,
 * but not from being allocated: registering 10,000 distinct schedules made 800 MB of garbage, whose
 * scavenges grew V8's young generation and the process's peak resident set by tens of MB. A
 * {@link CronMask} is a few numbers (a row of a scheduler's table of schedules); reading one and
 * answering its next tick allocate nothing that is kept.
 *
 * It reads only what it reads exactly as croner does, and says `undefined` for the rest (names,
 * nicknames, `L`, `W`, `#`, `+`, a year field, anything croner would refuse), which then goes to
 * croner: an expression croner refuses is refused by croner, with croner's message. Every answer is
 * croner's: `cron-mask.test.ts` compares both over generated expressions and instants.
 *
 * @packageDocumentation
 */

/** A field's values as bits: second and minute need 60, so they are two 30-bit halves. */
interface FieldSpec {
  /** Lowest value a number may have (1 for day of month and month). */
  readonly min: number;
  /** How many values the field has (croner's table length; day of week counts 7, not 8). */
  readonly size: number;
}

const SECOND: FieldSpec = { min: 0, size: 60 };
const MINUTE: FieldSpec = SECOND;
const HOUR: FieldSpec = { min: 0, size: 24 };
const DAY: FieldSpec = { min: 1, size: 31 };
const MONTH: FieldSpec = { min: 1, size: 12 };
const WEEKDAY: FieldSpec = { min: 0, size: 7 };

/** croner's "a number": digits only. */
const DIGITS = /^\d+$/;

/** croner gives up on a schedule whose next tick is at or after this year (no year field). */
const LAST_YEAR = 3000;
/** …or more than this many years after the instant asked from. */
const YEARS_SEARCHED = 400;

/** A field's set values as two 30-bit halves, or `undefined` when croner would not read it so. */
type Bits = [low: number, high: number];

/** Sets value `v` (a table index, 0-based) in `bits`. */
function set(bits: Bits, v: number): void {
  if (v < 30) bits[0] |= 1 << v;
  else bits[1] |= 1 << (v - 30);
}

/**
 * One field as croner reads it, restricted to numbers, `*`, ranges, steps and lists; `undefined`
 * for anything else or anything croner refuses (then croner reads it, and throws if it refuses).
 */
function readField(text: string, spec: FieldSpec, weekday: boolean): Bits | undefined {
  const bits: Bits = [0, 0];
  // A table index for a number as written: croner's offset (day and month count from 1), and
  // for the day of week 7 is Sunday. undefined when out of croner's range.
  const index = (n: number): number | undefined => {
    if (weekday && n === 7) return 0;
    const i = n - spec.min;
    return i >= 0 && i < spec.size ? i : undefined;
  };
  for (const part of text.split(',')) {
    if (part === '*') {
      for (let i = 0; i < spec.size; i++) set(bits, i);
      continue;
    }
    const slash = part.split('/');
    if (slash.length > 2) return undefined;
    const [range = '', stepText] = slash;
    let step = 1;
    if (stepText !== undefined) {
      if (!DIGITS.test(stepText)) return undefined;
      step = Number.parseInt(stepText, 10);
      if (step === 0 || step > spec.size) return undefined;
    }
    if (range === '*') {
      // croner steps `*/k` over table indices from 0, whatever the field's first value.
      if (stepText === undefined) return undefined;
      for (let i = 0; i < spec.size; i += step) set(bits, i);
      continue;
    }
    const dash = range.split('-');
    if (dash.length > 2) return undefined;
    const [fromText = '', toText] = dash;
    // A step needs a range (croner refuses `5/15` unless told to be sloppy).
    if (stepText !== undefined && toText === undefined) return undefined;
    if (!DIGITS.test(fromText) || (toText !== undefined && !DIGITS.test(toText))) return undefined;
    const from = Number.parseInt(fromText, 10);
    const to = toText === undefined ? from : Number.parseInt(toText, 10);
    if (from > to) return undefined;
    for (let n = from; n <= to; n += step) {
      const i = index(n);
      if (i === undefined) return undefined;
      set(bits, i);
    }
  }
  return bits;
}

/** Whether bit `v` is set in a 30-bit-halves pair. */
function has(low: number, high: number, v: number): boolean {
  return v < 30 ? (low & (1 << v)) !== 0 : (high & (1 << (v - 30))) !== 0;
}

/** The first set value ≥ `from` below `size`, or -1. */
function firstFrom(low: number, high: number, from: number, size: number): number {
  for (let v = from; v < size; v++) if (has(low, high, v)) return v;
  return -1;
}

/** The day of the week (0 Sunday) of a UTC date, without a `Date`: 1970-01-01 was a Thursday. */
function weekdayOf(year: number, month: number, day: number): number {
  const days = Date.UTC(year, month, day) / 86_400_000;
  return (((days + 4) % 7) + 7) % 7;
}

/**
 * How many 32-bit words a mask takes in a table row (see {@link readMaskInto}): the second's and
 * minute's two halves each, the hours, days, months and weekdays, and the day-field flags.
 */
export const MASK_WORDS = 9;

/** Word offsets in a mask row. */
const SECOND_LOW = 0;
const SECOND_HIGH = 1;
const MINUTE_LOW = 2;
const MINUTE_HIGH = 3;
const HOURS = 4;
const DAYS = 5;
const MONTHS = 6;
const WEEKDAYS = 7;
const FLAGS = 8;
/** Flags: the day of month was written `*` (croner's `starDOM`). */
const ANY_DAY = 1;
/** The day of week was written `*` (croner's `starDOW`). */
const ANY_WEEKDAY = 2;
/** Both day fields must match (croner's `domAndDow`), else either, when neither is `*`. */
const DOM_AND_DOW = 4;

/**
 * Reads `expression` as croner would in UTC into the {@link MASK_WORDS} words of `row` from
 * `at`, and answers whether it could: `false` when it is not one this reads (then croner must: it
 * may still be valid, or croner refuses it), and `row` is left as it was. A scheduler keeps its
 * schedules' masks as rows of one table: no object per schedule (docs/performance.md).
 */
export function readMaskInto(
  expression: string,
  domAndDow: boolean,
  row: Int32Array,
  at: number,
): boolean {
  if (typeof expression !== 'string') return false;
  const fields = expression.trim().split(/\s+/);
  if (fields.length === 5) fields.unshift('0');
  if (fields.length !== 6) return false;
  // croner reads `?` as `*` anywhere; alone in a field is all this reads.
  const text = fields.map((f) => (f === '?' ? '*' : f));
  const [s = '', m = '', h = '', dom = '', mon = '', dow = ''] = text;
  const second = readField(s, SECOND, false);
  const minute = readField(m, MINUTE, false);
  const hour = readField(h, HOUR, false);
  const day = readField(dom, DAY, false);
  const month = readField(mon, MONTH, false);
  const weekday = readField(dow, WEEKDAY, true);
  if (
    second === undefined ||
    minute === undefined ||
    hour === undefined ||
    day === undefined ||
    month === undefined ||
    weekday === undefined
  ) {
    return false;
  }
  row[at + SECOND_LOW] = second[0];
  row[at + SECOND_HIGH] = second[1];
  row[at + MINUTE_LOW] = minute[0];
  row[at + MINUTE_HIGH] = minute[1];
  row[at + HOURS] = hour[0];
  row[at + DAYS] = day[0] | (day[1] << 30);
  row[at + MONTHS] = month[0];
  row[at + WEEKDAYS] = weekday[0];
  row[at + FLAGS] =
    (dom === '*' ? ANY_DAY : 0) | (dow === '*' ? ANY_WEEKDAY : 0) | (domAndDow ? DOM_AND_DOW : 0);
  return true;
}

/** Whether the mask in `row` at `at` was read with the day-field rule `domAndDow`. */
export function maskDomAndDow(row: Int32Array, at: number): boolean {
  return ((row[at + FLAGS] as number) & DOM_AND_DOW) !== 0;
}

/** Whether day `day` of `month` (0-based) of `year` is one of the days of the mask at `at`. */
function dayMatches(
  row: Int32Array,
  at: number,
  year: number,
  month: number,
  day: number,
): boolean {
  const flags = row[at + FLAGS] as number;
  const onDay = ((row[at + DAYS] as number) & (1 << (day - 1))) !== 0;
  if ((flags & ANY_WEEKDAY) !== 0) return onDay;
  const onWeekday = ((row[at + WEEKDAYS] as number) & (1 << weekdayOf(year, month, day))) !== 0;
  return (flags & DOM_AND_DOW) === 0 && (flags & ANY_DAY) === 0
    ? onDay || onWeekday
    : onDay && onWeekday;
}

/**
 * The first tick strictly after `after` (ms, from 1970 on) of the mask in `row` at `at`, or NaN
 * when there is none before croner's horizon (year 3000, or 400 years after `after`): croner's
 * `nextRun` in UTC. Allocates nothing (no `Date`: the fields are found by arithmetic).
 *
 * From the first whole second after `after`, each field that does not match moves the candidate
 * to the first instant at which it could (the next month, day, hour, minute), until all match.
 */
export function maskNextAfter(row: Int32Array, at: number, after: number): number {
  const months = row[at + MONTHS] as number;
  const hours = row[at + HOURS] as number;
  const minuteLow = row[at + MINUTE_LOW] as number;
  const minuteHigh = row[at + MINUTE_HIGH] as number;
  const secondLow = row[at + SECOND_LOW] as number;
  const secondHigh = row[at + SECOND_HIGH] as number;
  let t = Math.floor(after / 1000) * 1000 + 1000;
  civil(Math.floor(t / DAY_MS));
  const firstYear = civilYear;
  for (;;) {
    // The candidate's UTC fields by arithmetic, not a Date each (10,000 schedules asked at start).
    const days = Math.floor(t / DAY_MS);
    const inDay = t - days * DAY_MS;
    civil(days);
    const year = civilYear;
    const month = civilMonth;
    const day = civilDay;
    const hour = Math.floor(inDay / 3_600_000);
    const minute = Math.floor(inDay / 60_000) % 60;
    if (year >= LAST_YEAR || year - firstYear > YEARS_SEARCHED) return Number.NaN;
    if ((months & (1 << month)) === 0) {
      t = Date.UTC(year, month + 1, 1);
      continue;
    }
    const h = dayMatches(row, at, year, month, day) ? firstFrom(hours, 0, hour, 24) : -1;
    if (h < 0) {
      t = Date.UTC(year, month, day + 1);
      continue;
    }
    if (h > hour) {
      t = Date.UTC(year, month, day, h);
      continue;
    }
    const m = firstFrom(minuteLow, minuteHigh, minute, 60);
    if (m < 0) {
      t = Date.UTC(year, month, day, hour + 1);
      continue;
    }
    if (m > minute) {
      t = Date.UTC(year, month, day, hour, m);
      continue;
    }
    const s = firstFrom(secondLow, secondHigh, Math.floor(inDay / 1000) % 60, 60);
    if (s >= 0) return Date.UTC(year, month, day, hour, minute, s);
    t = Date.UTC(year, month, day, hour, minute + 1);
  }
}

const DAY_MS = 86_400_000;

/** The UTC year, month (0-based) and day of the month {@link civil} found last. */
let civilYear = 1970;
let civilMonth = 0;
let civilDay = 1;

/**
 * The proleptic Gregorian date of `days` after 1970-01-01 (0 or more), into {@link civilYear},
 * {@link civilMonth} and {@link civilDay}: Howard Hinnant's `civil_from_days`, what `Date`'s UTC
 * getters answer, without a `Date`.
 */
function civil(days: number): void {
  const z = days + 719_468;
  const era = Math.floor(z / 146_097);
  const doe = z - era * 146_097; // [0, 146096]
  const yoe = Math.floor(
    (doe - Math.floor(doe / 1460) + Math.floor(doe / 36_524) - Math.floor(doe / 146_096)) / 365,
  ); // [0, 399]
  const doy = doe - (365 * yoe + Math.floor(yoe / 4) - Math.floor(yoe / 100)); // [0, 365]
  const mp = Math.floor((5 * doy + 2) / 153); // [0, 11], from March
  civilDay = doy - Math.floor((153 * mp + 2) / 5) + 1;
  civilMonth = mp < 10 ? mp + 2 : mp - 10;
  civilYear = yoe + era * 400 + (civilMonth <= 1 ? 1 : 0);
}

/**
 * A cron expression of numbers, `*`, ranges, steps and lists (5 or 6 fields), read in UTC as croner
 * reads it with the given day-field rule: its fields as bit masks, one row of {@link MASK_WORDS}
 * words, in a table of its own or, as a view, in a scheduler's table of schedules.
 */
export class CronMask {
  private constructor(
    private readonly row: Int32Array,
    private readonly at: number,
  ) {}

  /**
   * Reads `expression` as croner would in UTC, or answers `undefined` when it is not one this
   * reads (then croner must: it may still be valid, or croner refuses it).
   */
  static read(expression: string, domAndDow: boolean): CronMask | undefined {
    const row = new Int32Array(MASK_WORDS);
    return readMaskInto(expression, domAndDow, row, 0) ? new CronMask(row, 0) : undefined;
  }

  /**
   * The mask written in `row` at `at` by {@link readMaskInto}, read in place: rows are never
   * written again, so a table grown since (a copy) still holds the same words here.
   */
  static at(row: Int32Array, at: number): CronMask {
    return new CronMask(row, at);
  }

  /**
   * The first tick strictly after `after` (ms, from 1970 on), or `null` when there is none before
   * croner's horizon (year 3000, or 400 years after `after`): croner's `nextRun` in UTC.
   */
  nextAfter(after: number): number | null {
    const next = maskNextAfter(this.row, this.at, after);
    return Number.isNaN(next) ? null : next;
  }
}
