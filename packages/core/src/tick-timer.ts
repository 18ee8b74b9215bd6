/**
 * When a job's ticks fire on one node: the scheduler's due-tick path, free of any database. One
 * timer as an object; a scheduler keeps its jobs' timers as rows of one {@link TickTimers} table,
 * whose logic this is.
 *
 * The next tick is always computed from the previous *scheduled* tick, never from when a
 * (jittered, delayed) timer fired, so jitter and a slow event loop never drop a tick. Long waits
 * (a yearly job) are slept in steps of at most {@link MAX_TIMER_MS} and re-checked against the
 * clock after each step, so a delay never overflows `setTimeout`.
 *
 * @packageDocumentation
 */
import type { Clock } from './clock.js';
import { DEFAULT_MAX_LATE_MS, TickTimers } from './tick-timers.js';
import type { WakeQueue } from './wake-queue.js';

/** What a tick timer needs of a schedule: croner's `nextRun` (strictly after `after`). */
export interface TickSchedule {
  nextRun(after: Date): Date | null;
}

/** Options of a {@link TickTimer} whose ticks are about `subject` (see {@link TickTimerOptions.subject}). */
export interface TickTimerOptions<S = undefined> {
  /** Where the time comes from and how to wait. */
  readonly clock: Clock;
  /**
   * Where the timer waits: one queue can serve every timer on `clock` (the scheduler's does), so
   * that they hold one clock timer between them. Default: a queue of its own.
   */
  readonly queue?: WakeQueue;
  /**
   * Called for each due tick, once, at or after `tick + jitter`, with the timer's `subject`.
   * Must not throw. One function can serve many timers: none needs a closure of its own.
   */
  readonly onTick: (tick: Date, subject: S) => void;
  /** What the ticks are about, handed to `onTick` (the scheduler's job). */
  readonly subject?: S;
  /** Each tick fires after a random extra delay below this (ms). Default 0. */
  readonly jitterMs?: number;
  /** Random numbers in [0, 1) for the jitter. Default `Math.random`. */
  readonly random?: () => number;
  /**
   * A tick found later than this past its jittered time (the event loop stalled, the machine
   * slept, the clock jumped) is not fired: it is left to catch-up, which judges it by policy.
   * Default 60 000.
   */
  readonly maxLateMs?: number;
  /** The longest single timer step, ≤ {@link MAX_TIMER_MS} (the default). */
  readonly maxStepMs?: number;
}

export { DEFAULT_MAX_LATE_MS };

/**
 * Fires the ticks of one schedule after {@link TickTimer.start}: every tick after the start
 * instant (and those of the last `jitterMs` before it), in order, each exactly once, none before
 * it is due. A table of one {@link TickTimers} row.
 */
export class TickTimer<S = undefined> {
  private readonly timers: TickTimers;

  /**
   * @param subject what the ticks are about, when the options (shared by many timers) do not say:
   * default `options.subject`.
   */
  constructor(
    schedule: TickSchedule,
    options: TickTimerOptions<S>,
    subject: S = options.subject as S,
  ) {
    this.timers = new TickTimers({
      clock: options.clock,
      queue: options.queue,
      nextRun: (_schedule, after) => schedule.nextRun(new Date(after))?.getTime() ?? Number.NaN,
      onTick: (tick) => options.onTick(tick, subject),
      random: options.random,
      maxLateMs: options.maxLateMs,
      maxStepMs: options.maxStepMs,
    });
    this.timers.add(0, 0, options.jitterMs ?? 0);
  }

  /** The scheduled tick the timer is waiting for, if any. */
  get nextTick(): Date | undefined {
    const tick = this.timers.nextTick(0);
    return Number.isNaN(tick) ? undefined : new Date(tick);
  }

  /**
   * Fires every tick strictly after `now - jitterMs` (on the clock) until {@link TickTimer.stop}
   * (see {@link TickTimers.start}).
   */
  start(): void {
    this.timers.start(0);
  }

  /** Fires nothing more; the pending wait is cancelled. */
  stop(): void {
    this.timers.stop(0);
  }
}
