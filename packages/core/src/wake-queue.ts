/**
 * Many wake-ups on one timer of a {@link Clock}: the scheduler's tick timers wait here, so that
 * 10,000 jobs hold one system timer between them, not a Node `Timeout` (and a closure to call
 * back) each.
 *
 * @packageDocumentation
 */
import { type Clock, type ClockTimer, MAX_TIMER_MS } from './clock.js';

/**
 * Something that waits in a {@link WakeQueue}: the queue keeps its place in these fields (no
 * object of its own per wait) and calls {@link Sleeper.wake} once its time has come.
 */
export interface Sleeper {
  /** Its place in the queue; -1 when it is not waiting. Only the queue writes it. */
  wakeSlot: number;
  /** When it is to be woken, on the queue's clock (ms). Only the queue writes it. */
  wakeAt: number;
  /** The order it was queued in, so that equal times wake first-queued first. Only the queue writes it. */
  wakeSeq: number;
  /** Called once, at or after `wakeAt` on the clock; it may queue itself again. */
  wake(): void;
}

/**
 * Wakes each queued {@link Sleeper} at or after its time, earliest first (equal times in the
 * order queued), with one clock timer armed for the earliest. A binary heap: queueing and
 * removing cost O(log n).
 */
export class WakeQueue {
  private readonly heap: Sleeper[] = [];
  private seq = 0;
  /** The clock timer, armed for {@link WakeQueue.timerAt}; undefined when none is. */
  private timer: ClockTimer | undefined;
  private timerAt = Number.NaN;
  /** True while {@link WakeQueue.wakeDue} wakes: the timer is armed once, after the last. */
  private waking = false;
  private readonly onTimer = (): void => this.wakeDue();

  constructor(private readonly clock: Clock) {}

  /** How many sleepers are waiting. */
  get size(): number {
    return this.heap.length;
  }

  /**
   * Queues `sleeper` to be woken at `at` (clock ms), in its old place's stead if it was waiting.
   */
  add(sleeper: Sleeper, at: number): void {
    if (sleeper.wakeSlot >= 0) this.removeAt(sleeper.wakeSlot);
    sleeper.wakeAt = at;
    sleeper.wakeSeq = this.seq++;
    sleeper.wakeSlot = this.heap.length;
    this.heap.push(sleeper);
    this.up(sleeper.wakeSlot);
    this.arm();
  }

  /** Takes `sleeper` out of the queue, if it is waiting: it is not woken. */
  remove(sleeper: Sleeper): void {
    if (sleeper.wakeSlot < 0) return;
    this.removeAt(sleeper.wakeSlot);
    this.arm();
  }

  /** Wakes every sleeper whose time has come, then arms the clock timer for the next. */
  private wakeDue(): void {
    this.timer = undefined;
    this.timerAt = Number.NaN;
    const now = this.clock.now();
    this.waking = true;
    try {
      for (;;) {
        const first = this.heap[0];
        // Whoever queues itself again while woken does so for later than `now`: woken next time.
        if (first === undefined || first.wakeAt > now) break;
        this.removeAt(0);
        first.wake();
      }
    } finally {
      this.waking = false;
      this.arm();
    }
  }

  /** Arms the clock timer for the earliest sleeper, unless it is armed for that already. */
  private arm(): void {
    if (this.waking) return;
    const first = this.heap[0];
    if (first !== undefined && first.wakeAt === this.timerAt) return;
    this.timer?.cancel();
    this.timer = undefined;
    this.timerAt = Number.NaN;
    if (first === undefined) return;
    const wait = Math.min(Math.max(0, first.wakeAt - this.clock.now()), MAX_TIMER_MS);
    this.timerAt = first.wakeAt;
    this.timer = this.clock.setTimer(wait, this.onTimer);
  }

  private removeAt(slot: number): void {
    const heap = this.heap;
    const gone = heap[slot] as Sleeper;
    gone.wakeSlot = -1;
    const last = heap.pop() as Sleeper;
    if (slot === heap.length) return;
    heap[slot] = last;
    last.wakeSlot = slot;
    this.down(slot);
    this.up(last.wakeSlot);
  }

  private before(a: Sleeper, b: Sleeper): boolean {
    return a.wakeAt < b.wakeAt || (a.wakeAt === b.wakeAt && a.wakeSeq < b.wakeSeq);
  }

  private up(slot: number): void {
    const heap = this.heap;
    const item = heap[slot] as Sleeper;
    while (slot > 0) {
      const parentSlot = (slot - 1) >> 1;
      const parent = heap[parentSlot] as Sleeper;
      if (!this.before(item, parent)) break;
      heap[slot] = parent;
      parent.wakeSlot = slot;
      slot = parentSlot;
    }
    heap[slot] = item;
    item.wakeSlot = slot;
  }

  private down(slot: number): void {
    const heap = this.heap;
    const item = heap[slot] as Sleeper;
    for (;;) {
      let child = 2 * slot + 1;
      if (child >= heap.length) break;
      const right = child + 1;
      if (right < heap.length && this.before(heap[right] as Sleeper, heap[child] as Sleeper))
        child = right;
      const smaller = heap[child] as Sleeper;
      if (!this.before(smaller, item)) break;
      heap[slot] = smaller;
      smaller.wakeSlot = slot;
      slot = child;
    }
    heap[slot] = item;
    item.wakeSlot = slot;
  }
}
