/**
 * Strings kept as UTF-16 code units in one typed array: a scheduler's job names and cron
 * expressions.
 *
 * @packageDocumentation
 */

/** Code units and strings the table starts with; each column doubles when full. */
const FIRST_UNITS = 1024;
const FIRST_STRINGS = 16;
/** The most code units made into a string by one `String.fromCharCode.apply`. */
const CHUNK_UNITS = 8192;

/**
 * Strings by number, their code units copied into one `Uint16Array` (off V8's heap) rather than
 * the strings themselves held. A string a caller passes (a job's name, its cron expression) and
 * then drops dies young instead of being kept: 10,000 jobs held 10,000 names and, on distinct
 * schedules, 10,000 expressions (~40 and ~64 bytes each, the expressions built by concatenation
 * and flattened when read), which V8 counted about twice as surviving young allocation on the way
 * to the old generation, and which grew its young generation (docs/performance.md). A string is
 * made again when asked for, for a tick's run, an event or a ledger statement.
 */
export class StringTable {
  private units = new Uint16Array(FIRST_UNITS);
  private used = 0;
  /** Where each string starts in {@link StringTable.units}; string i ends where i + 1 starts. */
  private starts = new Int32Array(FIRST_STRINGS + 1);
  private count = 0;

  /** How many strings are kept. */
  get size(): number {
    return this.count;
  }

  /** Keeps a copy of `text` and answers its number. */
  add(text: string): number {
    const length = text.length;
    if (this.used + length > this.units.length) {
      let size = this.units.length;
      while (size < this.used + length) size *= 2;
      const units = new Uint16Array(size);
      units.set(this.units.subarray(0, this.used));
      this.units = units;
    }
    if (this.count + 2 > this.starts.length) {
      const starts = new Int32Array(this.starts.length * 2);
      starts.set(this.starts);
      this.starts = starts;
    }
    for (let i = 0; i < length; i++) this.units[this.used + i] = text.charCodeAt(i);
    this.used += length;
    const number = this.count++;
    this.starts[this.count] = this.used;
    return number;
  }

  /** String `number`, made now. */
  get(number: number): string {
    const from = this.starts[number] as number;
    const to = this.starts[number + 1] as number;
    // `apply` passes each code unit as an argument, and the stack bounds how many (Node 20
    // overflowed at about 125,000): a cron expression has no length limit, so long strings are
    // made a chunk at a time.
    if (to - from <= CHUNK_UNITS) return this.chunk(from, to);
    let text = '';
    for (let at = from; at < to; at += CHUNK_UNITS)
      text += this.chunk(at, Math.min(to, at + CHUNK_UNITS));
    return text;
  }

  private chunk(from: number, to: number): string {
    return String.fromCharCode.apply(null, this.units.subarray(from, to) as unknown as number[]);
  }

  /** Whether string `number` is `text`, compared without making it. */
  equals(number: number, text: string): boolean {
    const from = this.starts[number] as number;
    const to = this.starts[number + 1] as number;
    if (to - from !== text.length) return false;
    for (let i = 0; i < text.length; i++)
      if (this.units[from + i] !== text.charCodeAt(i)) return false;
    return true;
  }

  /** A 32-bit hash of `text` (FNV-1a over its code units), for tables that look strings up. */
  static hash(text: string, seed = 0x811c9dc5): number {
    let h = seed | 0;
    for (let i = 0; i < text.length; i++) h = Math.imul(h ^ text.charCodeAt(i), 0x01000193);
    return h;
  }
}
