/**
 * A scheduler's jobs by the 32-bit number of their lock keys, in typed arrays.
 *
 * @packageDocumentation
 */

/** Slots the table starts with; it doubles when half full. */
const FIRST_SLOTS = 16;

/**
 * Job rows by an int32 key (the second number of a job's lock key, unique among a scheduler's
 * jobs: registration refuses a name whose key collides), open addressing with linear probing in
 * two `Int32Array`s, off V8's heap. It stands for both a map of names to jobs and a set of key
 * numbers (two hash tables of 10,000 entries, ~0.8 MB that V8 counted as surviving young
 * allocation, docs/performance.md); a name is found by its key, then checked against the row's name.
 */
export class JobIndex {
  private keys = new Int32Array(FIRST_SLOTS);
  /** The row plus one; 0 for an empty slot. */
  private rows = new Int32Array(FIRST_SLOTS);
  private count = 0;

  /** The row of the job whose key number is `key`, or -1. */
  get(key: number): number {
    const mask = this.keys.length - 1;
    for (let slot = this.start(key, mask); ; slot = (slot + 1) & mask) {
      const row = this.rows[slot] as number;
      if (row === 0) return -1;
      if (this.keys[slot] === key) return row - 1;
    }
  }

  /** Records `row` as the job whose key number is `key` (not yet recorded). */
  set(key: number, row: number): void {
    if (2 * (this.count + 1) > this.keys.length) this.grow();
    this.put(key, row);
    this.count++;
  }

  private start(key: number, mask: number): number {
    // The key is a digest's bits already: its low bits spread well enough.
    return key & mask;
  }

  private put(key: number, row: number): void {
    const mask = this.keys.length - 1;
    let slot = this.start(key, mask);
    while (this.rows[slot] !== 0) slot = (slot + 1) & mask;
    this.keys[slot] = key;
    this.rows[slot] = row + 1;
  }

  private grow(): void {
    const keys = this.keys;
    const rows = this.rows;
    this.keys = new Int32Array(keys.length * 2);
    this.rows = new Int32Array(rows.length * 2);
    for (let slot = 0; slot < keys.length; slot++) {
      const row = rows[slot] as number;
      if (row !== 0) this.put(keys[slot] as number, row - 1);
    }
  }
}
