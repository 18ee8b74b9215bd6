/**
 * When a job's ticks fire on one node: the scheduler's due-tick path, free of any database.
 *
 * The next tick is always computed from the previous *scheduled* tick, never from when a
 * (jittered, delayed) timer fired, so jitter and a slow event loop never drop a tick. Long waits
 * (a yearly job) are slept in steps of at most {@link MAX_TIMER_MS} and re-checked against the
 * clock after each step, so a delay never overflows `setTimeout`.
 *
 * @packageDocumentation
 */
import { type Clock, MAX_TIMER_MS } from './clock.js';
import { type Sleeper, WakeQueue } from './wake-queue.js';

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

/** The default of {@link TickTimerOptions.maxLateMs}. */
export const DEFAULT_MAX_LATE_MS = 60_000;

/**
 * Fires the ticks of one schedule after {@link TickTimer.start}: every tick after the start
 * instant (and those of the last `jitterMs` before it), in order, each exactly once, none before
 * it is due.
 */
export class TickTimer<S = undefined> implements Sleeper {
  /**
   * The options, read when needed rather than copied into seven fields: a scheduler passes one
   * options object to all its jobs' timers (a job is the `subject`, given apart).
   */
  private readonly options: TickTimerOptions<S>;
  private readonly subject: S;
  /** The previous scheduled tick fired (or the start instant): the next is the first after it. */
  private last = 0;
  /**
   * The scheduled tick waited for, NaN when none is, and its jitter: it fires at
   * `dueTick + dueJitter`. Fields rather than an object, and the jitter a small integer rather
   * than a second time (a boxed number each): a scheduler holds one timer a job.
   */
  private dueTick = Number.NaN;
  private dueJitter = 0;
  private running = false;
  /** {@link Sleeper}'s fields: the queue's, not the timer's. */
  wakeSlot = -1;
  wakeAt = Number.NaN;
  wakeSeq = 0;

  /**
   * @param subject what the ticks are about, when the options (shared by many timers) do not say:
   * default `options.subject`.
   */
  constructor(
    private readonly schedule: TickSchedule,
    options: TickTimerOptions<S>,
    subject: S = options.subject as S,
  ) {
    // A timer without a queue gets one of its own, in an options object of its own.
    this.options =
      options.queue === undefined ? { ...options, queue: new WakeQueue(options.clock) } : options;
    this.subject = subject;
  }

  private get queue(): WakeQueue {
    return this.options.queue as WakeQueue;
  }

  private get clock(): Clock {
    return this.options.clock;
  }

  private get jitterMs(): number {
    return this.options.jitterMs ?? 0;
  }

  private get maxLateMs(): number {
    return this.options.maxLateMs ?? DEFAULT_MAX_LATE_MS;
  }

  private get maxStepMs(): number {
    return Math.min(this.options.maxStepMs ?? MAX_TIMER_MS, MAX_TIMER_MS);
  }

  /** The scheduled tick the timer is waiting for, if any. */
  get nextTick(): Date | undefined {
    return Number.isNaN(this.dueTick) ? undefined : new Date(this.dueTick);
  }

  /**
   * Fires every tick strictly after `now - jitterMs` (on the clock) until {@link TickTimer.stop}.
   * A tick of the last `jitterMs` before the start may not have fired anywhere yet (its jittered
   * instant is still to come, on a node this one replaces): it is still owed, at its own jittered
   * instant or at once if that is past. The ledger keeps it to one run across nodes.
   */
  start(): void {
    if (this.running) return;
    this.running = true;
    this.last = this.clock.now() - this.jitterMs;
    this.dueTick = Number.NaN;
    this.arm();
  }

  /** Fires nothing more; the pending wait is cancelled. */
  stop(): void {
    this.running = false;
    this.queue.remove(this);
    this.dueTick = Number.NaN;
  }

  /** For the queue: the wait is over, the clock is read again. */
  wake(): void {
    this.arm();
  }

  private arm(): void {
    while (this.running) {
      const now = this.clock.now();
      if (Number.isNaN(this.dueTick)) {
        // From the previous scheduled tick, but not from further back than a tick may be late.
        const from = Math.max(this.last, now - this.jitterMs - this.maxLateMs);
        const next = this.schedule.nextRun(new Date(from));
        if (next === null) return; // the schedule has no more ticks
        const tick = next.getTime();
        const random = this.options.random ?? Math.random;
        const jitter = this.jitterMs > 0 ? Math.floor(random() * this.jitterMs) : 0;
        this.dueTick = tick;
        this.dueJitter = jitter;
      }
      const wait = this.dueTick + this.dueJitter - now;
      if (wait > 0) {
        // Capped step; on waking, the clock is read again.
        this.queue.add(this, now + Math.min(wait, this.maxStepMs));
        return;
      }
      const tick = this.dueTick;
      this.dueTick = Number.NaN;
      if (now - tick > this.jitterMs + this.maxLateMs) continue; // too late: catch-up's
      this.last = tick;
      this.options.onTick(new Date(tick), this.subject);
    }
  }
}
