/**
 * The dashboard's one view of the database, shared by every page: an `inspect()` snapshot every
 * interval and a cheap `pg_locks` sample several times a second, taken one after another on one
 * loop each — so the database work is the same for one open page or fifty — and only while
 * someone is looking (from the server's start, then while a page is on the event stream or a
 * request came in the last minutes).
 */
import { type Inspection, inspect, KeyNames, type LockExecutor, sampleLocks } from '@lockkit/core';
import { LockHistory, type SeenLock } from './lock-history.js';

/** What every page is shown at one moment. */
export interface DashboardSnapshot {
  /** When the inspection was taken, ms since the epoch. */
  readonly at: number;
  readonly inspection: Inspection;
  /** Locks seen by the samples in the last {@link DashboardSnapshot.historySeconds}. */
  readonly recentLocks: readonly SeenLock[];
  readonly historySeconds: number;
  readonly sampleMs: number;
  readonly schema: string;
  /** The latest failure to read the database, when the last attempt failed. */
  readonly error: string | undefined;
}

/** Options of {@link DashboardFeed}. */
export interface DashboardFeedOptions {
  readonly executor: LockExecutor;
  readonly schema: string;
  readonly names: KeyNames | undefined;
  readonly intervalMs: number;
  readonly sampleMs: number;
  readonly historySeconds: number;
  /** How long the loops keep running after the last request when no page listens. */
  readonly idleMs: number;
}

type Listener = (snapshot: DashboardSnapshot) => void;
/** A waiter also hears of a failed first read (`undefined`): a request need not wait it out. */
type Waiter = (snapshot: DashboardSnapshot | undefined) => void;

/** The shared snapshot loop. */
export class DashboardFeed {
  private snapshot: DashboardSnapshot | undefined;
  /** One-shot waiters for the next snapshot. */
  private readonly waiters = new Set<Waiter>();
  /** Pages on the event stream. */
  private readonly subscribers = new Set<Listener>();
  private readonly history: LockHistory;
  private readonly names: KeyNames;
  private lastInterest = 0;
  private running = false;
  private closed = false;
  /** Bumped by every start: a loop from an earlier run (still awaiting its query) ends itself. */
  private generation = 0;
  private inspectTimer: NodeJS.Timeout | undefined;
  private sampleTimer: NodeJS.Timeout | undefined;
  private lastError: string | undefined;

  constructor(private readonly o: DashboardFeedOptions) {
    this.history = new LockHistory(o.historySeconds * 1000);
    // inspect() adds every lease and scheduled job to this registry; the samples decode with it.
    this.names = o.names ?? new KeyNames();
  }

  /**
   * The latest snapshot — or, when there is none yet or it is older than `fresherThanMs` (the
   * loops were idle), the next one, waiting up to `waitMs` for it.
   */
  async current(
    waitMs: number,
    fresherThanMs = Number.POSITIVE_INFINITY,
  ): Promise<DashboardSnapshot | undefined> {
    this.touch();
    const snapshot = this.snapshot;
    if (snapshot && Date.now() - snapshot.at <= fresherThanMs) return snapshot;
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        this.waiters.delete(listener);
        resolve(this.snapshot);
      }, waitMs);
      const listener: Waiter = (next) => {
        clearTimeout(timer);
        this.waiters.delete(listener);
        resolve(next);
      };
      this.waiters.add(listener);
    });
  }

  /** Calls `listener` with every new snapshot until the returned function is called. */
  subscribe(listener: Listener): () => void {
    const wrapped: Listener = (s) => listener(s);
    this.subscribers.add(wrapped);
    this.touch();
    return () => {
      this.subscribers.delete(wrapped);
      this.lastInterest = Date.now();
    };
  }

  /** Why the latest read of the database failed, when it did. */
  get error(): string | undefined {
    return this.lastError;
  }

  /** Stops both loops for good. */
  close(): void {
    this.closed = true;
    this.stop();
  }

  /** Starts the loops now (they also start on the first request, and stop when nobody looks). */
  start(): void {
    this.touch();
  }

  private touch(): void {
    this.lastInterest = Date.now();
    if (!this.running && !this.closed) this.run();
  }

  private interested(): boolean {
    return (
      !this.closed && (this.subscribers.size > 0 || Date.now() - this.lastInterest < this.o.idleMs)
    );
  }

  private run(): void {
    this.running = true;
    const generation = ++this.generation;
    void this.inspectLoop(generation);
    void this.sampleLoop(generation);
  }

  private isCurrent(generation: number): boolean {
    return this.running && !this.closed && generation === this.generation;
  }

  private stop(): void {
    this.running = false;
    clearTimeout(this.inspectTimer);
    clearTimeout(this.sampleTimer);
  }

  private async inspectLoop(generation: number): Promise<void> {
    if (!this.isCurrent(generation)) return;
    if (!this.interested()) {
      this.stop();
      return;
    }
    try {
      const inspection = await inspect(this.o.executor, {
        schema: this.o.schema,
        names: this.names,
        runsPerJob: 12,
        recentRuns: 30,
        // Counted every second: the latest 200 ticks of each job say how it is doing now.
        jobWindow: 200,
      });
      this.lastError = undefined;
      this.publish(inspection);
    } catch (error) {
      this.lastError = error instanceof Error ? error.message : String(error);
      if (this.snapshot) this.publish(this.snapshot.inspection);
      else for (const waiter of [...this.waiters]) waiter(undefined);
    }
    if (this.isCurrent(generation)) {
      this.inspectTimer = setTimeout(() => void this.inspectLoop(generation), this.o.intervalMs);
    }
  }

  private async sampleLoop(generation: number): Promise<void> {
    if (!this.isCurrent(generation) || !this.interested()) return;
    try {
      this.history.record(await sampleLocks(this.o.executor, { names: this.names }));
    } catch {
      // The inspection loop reports database failures; a missed sample only leaves a gap.
    }
    if (this.isCurrent(generation)) {
      this.sampleTimer = setTimeout(() => void this.sampleLoop(generation), this.o.sampleMs);
    }
  }

  private publish(inspection: Inspection): void {
    const snapshot: DashboardSnapshot = {
      at: Date.now(),
      inspection,
      recentLocks: this.history.recent(this.names),
      historySeconds: this.o.historySeconds,
      sampleMs: this.o.sampleMs,
      schema: this.o.schema,
      error: this.lastError,
    };
    this.snapshot = snapshot;
    for (const listener of [...this.waiters, ...this.subscribers]) {
      try {
        listener(snapshot);
      } catch {
        // A page that went away must not stop the others.
      }
    }
  }
}
