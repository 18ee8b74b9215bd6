/**
 * Knowing that a leased connection died, for drivers that do not say so (Prisma exposes no
 * connection events; postgres.js tells only that *some* connection closed). The watch asks the
 * server, through a connection of the pool, which watched backend pids are gone, and reports each
 * one to its lease's {@link ConnectionFate}. One module for every adapter, tested once.
 *
 * @packageDocumentation
 */
import type { ConnectionFate } from './connection-fate.js';
import { deadBackendsStatement } from './sql/locks.js';

/** Runs one statement outside any watched transaction (through the pool); resolves with rows. */
export type RunStatement = (text: string, params: readonly unknown[]) => Promise<unknown>;

/** One leased connection under watch. */
export interface WatchedBackend {
  /** Server pid of the connection (`pg_backend_pid()`), once known; unknown ones are skipped. */
  pid: number | undefined;
  /** Aborted when the backend is found gone. */
  readonly fate: ConnectionFate;
}

/** Options of a {@link BackendWatch}. */
export interface BackendWatchOptions {
  /**
   * Ask every this many milliseconds while something is watched (for drivers that report
   * nothing). Without it the watch asks only when {@link BackendWatch.check} is called.
   */
  readonly intervalMs?: number;
  /**
   * When a check itself fails: `'ignore'` (it says nothing about the watched connections; try
   * again next time) or `'abort'` (the server is unreachable, so no watched connection is usable).
   * Default `'ignore'`.
   */
  readonly onCheckFailure?: 'ignore' | 'abort';
}

/** A backend exit is visible in `pg_stat_activity` a moment after the socket closes. */
const ON_DEMAND_DELAYS_MS = [0, 50, 200] as const;

/** Watches backend pids while tasks run on them. */
export class BackendWatch {
  private readonly watched = new Set<WatchedBackend>();
  private timer: NodeJS.Timeout | undefined;
  private checking: Promise<void> | undefined;
  private polling = false;

  constructor(
    private readonly run: RunStatement,
    private readonly options: BackendWatchOptions = {},
  ) {}

  /** Starts watching `backend`; the returned function stops. */
  add(backend: WatchedBackend): () => void {
    this.watched.add(backend);
    const { intervalMs } = this.options;
    if (intervalMs !== undefined && this.timer === undefined) {
      this.timer = setInterval(() => {
        if (this.checking === undefined && !this.polling) void this.poll();
      }, intervalMs);
      this.timer.unref();
    }
    return () => {
      this.watched.delete(backend);
      if (this.watched.size === 0 && this.timer !== undefined) {
        clearInterval(this.timer);
        this.timer = undefined;
      }
    };
  }

  /** Resolves once no check is running (queries on watched connections may wait on this). */
  settled(): Promise<void> | undefined {
    return this.checking;
  }

  /**
   * Checks now (a connection just closed, say), asking again briefly until a dead one is found,
   * since a backend's exit shows a moment late. Concurrent calls share one check.
   */
  check(): Promise<void> {
    if (this.watched.size === 0) return Promise.resolve();
    this.checking ??= (async () => {
      try {
        for (const delay of ON_DEMAND_DELAYS_MS) {
          if (delay > 0) await new Promise((resolve) => setTimeout(resolve, delay));
          if ((await this.once()) !== 0) return;
        }
      } catch (error) {
        this.failed(error);
      } finally {
        this.checking = undefined;
      }
    })();
    return this.checking;
  }

  /** One periodic question; a failure waits for the next one (or aborts, per the options). */
  private async poll(): Promise<void> {
    this.polling = true;
    try {
      await this.once();
    } catch (error) {
      this.failed(error);
    } finally {
      this.polling = false;
    }
  }

  /** One question to the server; returns how many watched backends were found gone (-1: none asked). */
  private async once(): Promise<number> {
    const live = [...this.watched].filter((w) => w.pid !== undefined && !w.fate.aborted);
    if (live.length === 0) return -1;
    const statement = deadBackendsStatement([...new Set(live.map((w) => w.pid as number))]);
    const rows = (await this.run(statement.text, statement.params)) as ArrayLike<{ pid: unknown }>;
    const dead = new Set(Array.from(rows, (row) => Number(row.pid)));
    for (const backend of live) {
      if (dead.has(backend.pid as number)) {
        backend.fate.abort(
          Object.assign(new Error(`Connection to backend ${backend.pid} closed`), {
            code: 'CONNECTION_CLOSED',
          }),
        );
      }
    }
    return dead.size;
  }

  private failed(error: unknown): void {
    if (this.options.onCheckFailure !== 'abort') return;
    for (const backend of this.watched) backend.fate.abort(error);
  }
}
