/**
 * Many tick timers as rows of one table: what a scheduler times its jobs' ticks with.
 *
 * @packageDocumentation
 */
import { type Clock, MAX_TIMER_MS } from './clock.js';
import { type Sleeper, WakeQueue } from './wake-queue.js';

/** Options shared by every timer of a {@link TickTimers} table. */
export interface TickTimersOptions {
  /** Where the time comes from and how to wait. */
  readonly clock: Clock;
  /**
   * Where the table waits, as one sleeper for all its timers: one queue can serve many tables on
   * `clock`. Default: a queue of its own.
   */
  readonly queue?: WakeQueue | undefined;
  /**
   * The first tick of schedule `schedule` (a timer's number for it) strictly after `after` (ms),
   * or NaN when there is none: croner's `nextRun`.
   */
  readonly nextRun: (schedule: number, after: number) => number;
  /**
   * Called for each due tick, once, at or after `tick + jitter`, with the timer's `subject`.
   * Must not throw.
   */
  readonly onTick: (tick: Date, subject: number) => void;
  /** Random numbers in [0, 1) for the jitter. Default `Math.random`. */
  readonly random?: (() => number) | undefined;
  /**
   * A tick found later than this past its jittered time (the event loop stalled, the machine
   * slept, the clock jumped) is not fired: it is left to catch-up, which judges it by policy.
   * Default {@link DEFAULT_MAX_LATE_MS}.
   */
  readonly maxLateMs?: number | undefined;
  /** The longest single timer step, ≤ {@link MAX_TIMER_MS} (the default). */
  readonly maxStepMs?: number | undefined;
}

/** The default of {@link TickTimersOptions.maxLateMs}. */
export const DEFAULT_MAX_LATE_MS = 60_000;

/** Rows the table starts with; its columns double when full. */
const FIRST_ROWS = 4;

/**
 * Tick timers, each a row: its schedule, subject and jitter, its previous scheduled tick, the tick
 * it waits for and its wait, all numbers in typed arrays (off V8's heap), with the waits ordered
 * by a binary heap of row numbers. The table waits in its {@link WakeQueue} as one sleeper, at
 * the earliest of its timers' wake times.
 *
 * Each timer fires the ticks of its schedule after {@link TickTimers.start}: every tick after the
 * start instant (and those of the last `jitterMs` before it), in order, each exactly once, none
 * before it is due. The next tick is always computed from the previous *scheduled* tick, never
 * from when a (jittered, delayed) wait ended, so jitter and a slow event loop never drop a tick.
 * Long waits (a yearly job) are slept in steps of at most {@link MAX_TIMER_MS} and checked
 * against the clock after each step, so a delay never overflows `setTimeout`.
 *
 * A timer object a job (`TickTimer`, ~150 bytes with its boxed times) was what 10,000 jobs on
 * distinct schedules kept most of at `start()`; kept objects are first allocated in V8's young
 * generation and grow it (docs/performance.md). A row is ~70 bytes of typed arrays.
 */
export class TickTimers implements Sleeper {
  private readonly clock: Clock;
  private readonly queue: WakeQueue;
  private readonly nextRun: (schedule: number, after: number) => number;
  private readonly onTick: (tick: Date, subject: number) => void;
  private readonly random: () => number;
  private readonly maxLateMs: number;
  private readonly maxStepMs: number;
  /** How many rows are in use. */
  private rows = 0;
  private schedules = new Int32Array(FIRST_ROWS);
  private subjects = new Int32Array(FIRST_ROWS);
  /** Each timer's jitter bound (ms), which a `TickTimer` may set beyond 32 bits. */
  private jitters = new Float64Array(FIRST_ROWS);
  /** 1 while the timer runs. */
  private running = new Uint8Array(FIRST_ROWS);
  /** The previous scheduled tick fired (or the start instant): the next is the first after it. */
  private last = new Float64Array(FIRST_ROWS);
  /** The scheduled tick waited for, NaN when none is, and its jitter (ms). */
  private due = new Float64Array(FIRST_ROWS);
  private dueJitter = new Float64Array(FIRST_ROWS);
  /** When the timer is to be woken (ms), the order it was queued in, and its place in the heap. */
  private at = new Float64Array(FIRST_ROWS);
  private seq = new Float64Array(FIRST_ROWS);
  private slot = new Int32Array(FIRST_ROWS);
  /** Rows waiting, earliest first (then first queued): a binary heap of `heapSize` rows. */
  private heap = new Int32Array(FIRST_ROWS);
  private heapSize = 0;
  private nextSeq = 0;
  /** True while {@link TickTimers.wake} wakes: the table is queued again once, after the last. */
  private waking = false;
  /** {@link Sleeper}'s fields: the queue's, not the table's. */
  wakeSlot = -1;
  wakeAt = Number.NaN;
  wakeSeq = 0;

  constructor(options: TickTimersOptions) {
    this.clock = options.clock;
    this.queue = options.queue ?? new WakeQueue(options.clock);
    this.nextRun = options.nextRun;
    this.onTick = options.onTick;
    this.random = options.random ?? Math.random;
    this.maxLateMs = options.maxLateMs ?? DEFAULT_MAX_LATE_MS;
    this.maxStepMs = Math.min(options.maxStepMs ?? MAX_TIMER_MS, MAX_TIMER_MS);
  }

  /** How many timers the table has (stopped ones included). */
  get size(): number {
    return this.rows;
  }

  /** How many timers are waiting for a tick (or for a step towards one). */
  get waiting(): number {
    return this.heapSize;
  }

  /**
   * A new timer, stopped: of `schedule` (handed to `nextRun`), about `subject` (handed to
   * `onTick`), each tick fired after a random extra delay below `jitterMs`. Its row number.
   */
  add(schedule: number, subject: number, jitterMs: number): number {
    const row = this.rows;
    this.room(row + 1);
    this.rows = row + 1;
    this.schedules[row] = schedule;
    this.subjects[row] = subject;
    this.jitters[row] = jitterMs;
    this.running[row] = 0;
    this.due[row] = Number.NaN;
    this.at[row] = Number.NaN;
    this.slot[row] = -1;
    return row;
  }

  /** The scheduled tick timer `row` is waiting for (ms), NaN if none. */
  nextTick(row: number): number {
    return this.due[row] as number;
  }

  /**
   * Fires every tick of timer `row` strictly after `now - jitterMs` (on the clock) until
   * {@link TickTimers.stop}. A tick of the last `jitterMs` before the start may not have fired
   * anywhere yet (its jittered instant is still to come, on a node this one replaces): it is still
   * owed, at its own jittered instant or at once if that is past. The ledger keeps it to one run
   * across nodes.
   */
  start(row: number): void {
    if (this.running[row] === 1) return;
    this.running[row] = 1;
    this.last[row] = this.clock.now() - (this.jitters[row] as number);
    this.due[row] = Number.NaN;
    this.arm(row);
  }

  /** Timer `row` fires nothing more; its pending wait is cancelled. */
  stop(row: number): void {
    this.running[row] = 0;
    this.due[row] = Number.NaN;
    if ((this.slot[row] as number) >= 0) {
      this.removeAt(this.slot[row] as number);
      this.requeue();
    }
  }

  /** Stops every timer of the table. */
  stopAll(): void {
    this.running.fill(0);
    this.due.fill(Number.NaN);
    while (this.heapSize > 0) this.removeAt(this.heapSize - 1);
    this.requeue();
  }

  /** For the queue: the earliest wait is over; every timer whose wait is over reads the clock again. */
  wake(): void {
    const now = this.clock.now();
    this.waking = true;
    try {
      // A timer queued again while woken is queued for later than `now`: woken next time.
      while (this.heapSize > 0) {
        const first = this.heap[0] as number;
        if ((this.at[first] as number) > now) break;
        this.removeAt(0);
        this.arm(first);
      }
    } finally {
      this.waking = false;
      this.requeue();
    }
  }

  private arm(row: number): void {
    while (this.running[row] === 1) {
      const now = this.clock.now();
      const jitterMs = this.jitters[row] as number;
      if (Number.isNaN(this.due[row] as number)) {
        // From the previous scheduled tick, but not from further back than a tick may be late.
        const from = Math.max(this.last[row] as number, now - jitterMs - this.maxLateMs);
        const next = this.nextRun(this.schedules[row] as number, from);
        if (Number.isNaN(next)) return; // the schedule has no more ticks
        this.due[row] = next;
        this.dueJitter[row] = jitterMs > 0 ? Math.floor(this.random() * jitterMs) : 0;
      }
      const wait = (this.due[row] as number) + (this.dueJitter[row] as number) - now;
      if (wait > 0) {
        // Capped step; on waking, the clock is read again.
        this.enqueue(row, now + Math.min(wait, this.maxStepMs));
        return;
      }
      const tick = this.due[row] as number;
      this.due[row] = Number.NaN;
      if (now - tick > jitterMs + this.maxLateMs) continue; // too late: catch-up's
      this.last[row] = tick;
      this.onTick(new Date(tick), this.subjects[row] as number);
    }
  }

  /** Queues timer `row` to wake at `at`, in its old place's stead if it was waiting. */
  private enqueue(row: number, at: number): void {
    if ((this.slot[row] as number) >= 0) this.removeAt(this.slot[row] as number);
    this.at[row] = at;
    this.seq[row] = this.nextSeq++;
    const slot = this.heapSize++;
    this.heap[slot] = row;
    this.slot[row] = slot;
    this.up(slot);
    this.requeue();
  }

  /** Waits in the queue for the earliest timer, unless waking (then once, after the last). */
  private requeue(): void {
    if (this.waking) return;
    if (this.heapSize === 0) {
      this.queue.remove(this);
      return;
    }
    const at = this.at[this.heap[0] as number] as number;
    if (this.wakeSlot >= 0 && this.wakeAt === at) return;
    this.queue.add(this, at);
  }

  private removeAt(slot: number): void {
    const heap = this.heap;
    const gone = heap[slot] as number;
    this.slot[gone] = -1;
    const last = heap[--this.heapSize] as number;
    if (slot === this.heapSize) return;
    heap[slot] = last;
    this.slot[last] = slot;
    this.down(slot);
    this.up(this.slot[last] as number);
  }

  private before(a: number, b: number): boolean {
    const at = this.at;
    const atA = at[a] as number;
    const atB = at[b] as number;
    return atA < atB || (atA === atB && (this.seq[a] as number) < (this.seq[b] as number));
  }

  private up(slot: number): void {
    const heap = this.heap;
    const row = heap[slot] as number;
    while (slot > 0) {
      const parentSlot = (slot - 1) >> 1;
      const parent = heap[parentSlot] as number;
      if (!this.before(row, parent)) break;
      heap[slot] = parent;
      this.slot[parent] = slot;
      slot = parentSlot;
    }
    heap[slot] = row;
    this.slot[row] = slot;
  }

  private down(slot: number): void {
    const heap = this.heap;
    const row = heap[slot] as number;
    for (;;) {
      let child = 2 * slot + 1;
      if (child >= this.heapSize) break;
      const right = child + 1;
      if (right < this.heapSize && this.before(heap[right] as number, heap[child] as number))
        child = right;
      const smaller = heap[child] as number;
      if (!this.before(smaller, row)) break;
      heap[slot] = smaller;
      this.slot[smaller] = slot;
      slot = child;
    }
    heap[slot] = row;
    this.slot[row] = slot;
  }

  /** Grows every column to hold `rows` rows, doubling. */
  private room(rows: number): void {
    if (rows <= this.heap.length) return;
    let size = this.heap.length;
    while (size < rows) size *= 2;
    const grow = <A extends Int32Array | Float64Array | Uint8Array>(
      column: A,
      make: (n: number) => A,
    ): A => {
      const bigger = make(size);
      bigger.set(column);
      return bigger;
    };
    const int32 = (n: number) => new Int32Array(n);
    const float64 = (n: number) => new Float64Array(n);
    this.schedules = grow(this.schedules, int32);
    this.subjects = grow(this.subjects, int32);
    this.jitters = grow(this.jitters, float64);
    this.running = grow(this.running, (n) => new Uint8Array(n));
    this.last = grow(this.last, float64);
    this.due = grow(this.due, float64);
    this.dueJitter = grow(this.dueJitter, float64);
    this.at = grow(this.at, float64);
    this.seq = grow(this.seq, float64);
    this.slot = grow(this.slot, int32);
    this.heap = grow(this.heap, int32);
  }
}
