/**
 * A plain cron expression read in UTC as a handful of bit masks, and its next tick by arithmetic:
 * what the scheduler uses instead of a croner parse for the expressions most schedules are.
 *
 * croner 11 builds a `CronPattern` of per-field tables at every parse, among them a 10,000-entry
 * year table (~80 KB). Sharing the tables afterwards (`cron-tables.ts`) keeps that from being held,
 * but not from being allocated: registering 10,000 distinct schedules made 800 MB of garbage, whose
 * scavenges grew V8's young generation and the process's peak resident set by tens of MB. A
 * {@link CronMask} is a few numbers; reading one and answering its next tick allocate nothing but
 * the answer.
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
 * A cron expression of numbers, `*`, ranges, steps and lists (5 or 6 fields), read in UTC as croner
 * reads it with the given day-field rule: its fields as bit masks, a few numbers in all.
 */
export class CronMask {
  private constructor(
    private readonly secondLow: number,
    private readonly secondHigh: number,
    private readonly minuteLow: number,
    private readonly minuteHigh: number,
    private readonly hours: number,
    private readonly days: number,
    private readonly months: number,
    private readonly weekdays: number,
    /** The day of month was written `*` (croner's `starDOM`). */
    private readonly anyDay: boolean,
    /** The day of week was written `*` (croner's `starDOW`). */
    private readonly anyWeekday: boolean,
    /** Both day fields must match (croner's `domAndDow`), else either, when neither is `*`. */
    private readonly domAndDow: boolean,
  ) {}

  /**
   * Reads `expression` as croner would in UTC, or answers `undefined` when it is not one this
   * reads (then croner must: it may still be valid, or croner refuses it).
   */
  static read(expression: string, domAndDow: boolean): CronMask | undefined {
    if (typeof expression !== 'string') return undefined;
    const fields = expression.trim().split(/\s+/);
    if (fields.length === 5) fields.unshift('0');
    if (fields.length !== 6) return undefined;
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
      return undefined;
    }
    return new CronMask(
      second[0],
      second[1],
      minute[0],
      minute[1],
      hour[0],
      day[0] | (day[1] << 30),
      month[0],
      weekday[0],
      dom === '*',
      dow === '*',
      domAndDow,
    );
  }

  /** Whether day `day` of `month` (0-based) of `year` is one of the schedule's days. */
  private dayMatches(year: number, month: number, day: number): boolean {
    const onDay = (this.days & (1 << (day - 1))) !== 0;
    if (this.anyWeekday) return onDay;
    const onWeekday = (this.weekdays & (1 << weekdayOf(year, month, day))) !== 0;
    return !this.domAndDow && !this.anyDay ? onDay || onWeekday : onDay && onWeekday;
  }

  /**
   * The first tick strictly after `after` (ms, from 1970 on), or `null` when there is none before
   * croner's horizon (year 3000, or 400 years after `after`): croner's `nextRun` in UTC.
   *
   * From the first whole second after `after`, each field that does not match moves the candidate
   * to the first instant at which it could (the next month, day, hour, minute), until all match.
   */
  nextAfter(after: number): number | null {
    let t = Math.floor(after / 1000) * 1000 + 1000;
    const firstYear = new Date(t).getUTCFullYear();
    for (;;) {
      const at = new Date(t);
      const year = at.getUTCFullYear();
      const month = at.getUTCMonth();
      const day = at.getUTCDate();
      const hour = at.getUTCHours();
      const minute = at.getUTCMinutes();
      if (year >= LAST_YEAR || year - firstYear > YEARS_SEARCHED) return null;
      if ((this.months & (1 << month)) === 0) {
        t = Date.UTC(year, month + 1, 1);
        continue;
      }
      const h = this.dayMatches(year, month, day) ? firstFrom(this.hours, 0, hour, 24) : -1;
      if (h < 0) {
        t = Date.UTC(year, month, day + 1);
        continue;
      }
      if (h > hour) {
        t = Date.UTC(year, month, day, h);
        continue;
      }
      const m = firstFrom(this.minuteLow, this.minuteHigh, minute, 60);
      if (m < 0) {
        t = Date.UTC(year, month, day, hour + 1);
        continue;
      }
      if (m > minute) {
        t = Date.UTC(year, month, day, hour, m);
        continue;
      }
      const s = firstFrom(this.secondLow, this.secondHigh, at.getUTCSeconds(), 60);
      if (s >= 0) return Date.UTC(year, month, day, hour, minute, s);
      t = Date.UTC(year, month, day, hour, minute + 1);
    }
  }
}
