/**
 * The scheduler's sense of time: what time it is, and a way to be called back later. The system
 * clock is the default; a {@link SimulatedClock} lets a test run years of schedule in milliseconds.
 *
 * @packageDocumentation
 */
import { LockkitError } from './errors.js';

/**
 * The longest delay one timer of a {@link Clock} may be asked for: 2^31-1 ms (~24.8 days).
 * Node's `setTimeout` turns anything longer into 1 ms, so longer waits are slept in steps.
 */
export const MAX_TIMER_MS = 2_147_483_647;

/** A pending callback of a {@link Clock}; `cancel()` is safe to call more than once. */
export interface ClockTimer {
  /** Makes sure the callback does not run (a no-op once it ran). */
  cancel(): void;
}

/**
 * Where the scheduler reads the time and waits. Pass one as `clock` in the scheduler's options to
 * test your own schedules on a {@link SimulatedClock}.
 *
 * @example
 * ```ts
 * const clock: Clock = { now: () => Date.now(), setTimer: (ms, cb) => { const t = setTimeout(cb, ms); return { cancel: () => clearTimeout(t) }; } };
 * ```
 */
export interface Clock {
  /** The time, in ms since the epoch. */
  now(): number;
  /**
   * Calls `callback` once, `ms` milliseconds from now on this clock. Callers never ask for more
   * than {@link MAX_TIMER_MS}; a long wait is taken in steps, re-reading {@link Clock.now} after each.
   */
  setTimer(ms: number, callback: () => void): ClockTimer;
}

/** A `setTimeout` of the system clock: one small object, no closure (a scheduler holds one a job). */
class SystemTimer implements ClockTimer {
  constructor(private readonly timeout: NodeJS.Timeout) {}
  cancel(): void {
    clearTimeout(this.timeout);
  }
}

/** The real clock: `Date.now` and `setTimeout` (never given more than {@link MAX_TIMER_MS}). */
export const systemClock: Clock = Object.freeze({
  now: () => Date.now(),
  setTimer(ms: number, callback: () => void): ClockTimer {
    return new SystemTimer(setTimeout(callback, Math.min(Math.max(0, ms), MAX_TIMER_MS)));
  },
});

interface PendingTimer {
  readonly at: number;
  readonly seq: number;
  readonly callback: () => void;
  cancelled: boolean;
}

/**
 * A clock that only moves when a test moves it. Timers run in order of their due time (then of
 * creation), each with {@link SimulatedClock.now} set to its own due time; pending promise
 * callbacks run between two timers, so code that arms its next timer after an `await` keeps up.
 *
 * @example
 * ```ts
 * const clock = new SimulatedClock(Date.UTC(2027, 0, 1));
 * const scheduler = createScheduler(locks, { clock });
 * scheduler.register('yearly', '0 0 0 1 1 *', async () => {});
 * await scheduler.start();
 * await clock.advanceTo(Date.UTC(2037, 0, 1)); // ten years, in milliseconds
 * ```
 */
export class SimulatedClock implements Clock {
  private time: number;
  private seq = 0;
  private readonly timers: PendingTimer[] = [];

  /** @param start - the initial time (ms since the epoch, or a Date). */
  constructor(start: number | Date = 0) {
    this.time = typeof start === 'number' ? start : start.getTime();
    if (!Number.isFinite(this.time))
      throw new LockkitError('OPTION_INVALID', 'SimulatedClock: the start must be a finite time.');
  }

  /** The simulated time, in ms since the epoch. */
  now(): number {
    return this.time;
  }

  /**
   * Arms a timer `ms` from the simulated now. Like Node, refuses nothing: a delay above
   * {@link MAX_TIMER_MS} is an error here, so a test catches code that would overflow `setTimeout`.
   */
  setTimer(ms: number, callback: () => void): ClockTimer {
    if (!(ms <= MAX_TIMER_MS)) {
      throw new LockkitError(
        'OPTION_INVALID',
        `SimulatedClock: a timer of ${ms} ms exceeds ${MAX_TIMER_MS} ms, which setTimeout would turn into 1 ms.`,
      );
    }
    const timer: PendingTimer = {
      at: this.time + Math.max(0, ms),
      seq: this.seq++,
      callback,
      cancelled: false,
    };
    // Kept sorted by (at, seq): insertion from the end, where new timers usually go.
    let i = this.timers.length;
    while (i > 0 && (this.timers[i - 1] as PendingTimer).at > timer.at) i--;
    this.timers.splice(i, 0, timer);
    return {
      cancel: () => {
        timer.cancelled = true;
      },
    };
  }

  /** How many timers are armed and not cancelled. */
  get pendingTimers(): number {
    return this.timers.filter((t) => !t.cancelled).length;
  }

  /** When the earliest armed timer is due, or `undefined` when none is. */
  nextTimerAt(): number | undefined {
    this.dropCancelled();
    return this.timers[0]?.at;
  }

  /**
   * Moves the time forward by `ms` without running any timer, as when the machine slept or the
   * wall clock stepped: the timers that came due run, late, at the next advance.
   */
  jump(ms: number): void {
    this.time += Math.max(0, ms);
  }

  /** Moves the clock forward by `ms`, running every timer due on the way. */
  advance(ms: number): Promise<void> {
    return this.advanceTo(this.time + ms);
  }

  /**
   * Moves the clock to `to` (never backwards), running every timer due up to and including `to`
   * in order, each at its own due time, and letting pending promise callbacks run after each.
   */
  async advanceTo(to: number | Date): Promise<void> {
    const target = typeof to === 'number' ? to : to.getTime();
    for (;;) {
      this.dropCancelled();
      const next = this.timers[0];
      if (next === undefined || next.at > target) break;
      this.timers.shift();
      this.time = Math.max(this.time, next.at);
      next.callback();
      await settle();
    }
    this.time = Math.max(this.time, target);
    await settle();
  }

  private dropCancelled(): void {
    while (this.timers[0]?.cancelled) this.timers.shift();
  }
}

/** Lets already-resolved promise callbacks (and those they resolve) run. */
async function settle(): Promise<void> {
  for (let i = 0; i < 5; i++) await null;
}
