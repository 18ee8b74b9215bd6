/**
 * Knowing that a leased connection died, for drivers that do not say so (Prisma exposes no
 * connection events; postgres.js tells only that *some* connection closed). The watch asks the
 * server, through a connection of the pool, which watched backend pids are gone, and reports each
 * one to its lease's {@link ConnectionFate}. That question needs a free connection: while every
 * connection of the pool is busy it waits, so a watched lease may also be probed on its own
 * connection ({@link WatchedBackend.probe}). One module for every adapter, tested once.
 *
 * @packageDocumentation
 */
import type { ConnectionFate } from './connection-fate.js';
import { isConnectionLoss } from './connection-loss.js';
import { deadBackendsStatement } from './sql/locks.js';

/** Runs one statement outside any watched transaction (through the pool); resolves with rows. */
export type RunStatement = (text: string, params: readonly unknown[]) => Promise<unknown>;

/** One leased connection under watch. */
export interface WatchedBackend {
  /** Server pid of the connection (`pg_backend_pid()`), once known; unknown ones are skipped. */
  pid: number | undefined;
  /** Aborted when the backend is found gone. */
  readonly fate: ConnectionFate;
  /**
   * Sends a harmless statement (`SELECT 1`) on the watched connection itself. Used only while the
   * periodic question through the pool is still waiting when the next one is due: every connection
   * of the pool is busy, so the pool cannot say whether this one died, but a statement on a dead
   * connection fails at once. A rejection that is a lost connection aborts the fate; any other
   * (a failed transaction refuses statements) says nothing. At most one probe per backend at a time.
   */
  readonly probe?: () => Promise<unknown>;
}

/** Options of a {@link BackendWatch}. */
export interface BackendWatchOptions {
  /**
   * Ask every this many milliseconds while something is watched (for drivers that report
   * nothing). Without it the watch asks only when {@link BackendWatch.check} is called. When a
   * question is still waiting as the next one falls due, the watched backends that have a
   * {@link WatchedBackend.probe} are probed instead.
   */
  readonly intervalMs?: number;
  /**
   * When a check itself fails: `'ignore'` (it says nothing about the watched connections; try
   * again next time) or `'abort'` (the server is unreachable, so no watched connection is usable).
   * Default `'ignore'`.
   */
  readonly onCheckFailure?: 'ignore' | 'abort';
  /**
   * A check ({@link BackendWatch.check}) still unanswered after this many milliseconds counts as
   * failed (see {@link BackendWatchOptions.onCheckFailure}), and queries waiting on it go on.
   * A pool that cannot open a connection may never answer the question — postgres.js 3.4 leaves a
   * request waiting for a reconnect the server refused (too many connections) unsettled — and
   * nothing may wait on it for ever. Default 10,000.
   */
  readonly checkTimeoutMs?: number;
}

/** See {@link BackendWatchOptions.checkTimeoutMs}. */
const CHECK_TIMEOUT_MS = 10_000;

/** `promise`, or a rejection with `error()` once `ms` have passed (the timer does not hold the process). */
function within<T>(promise: Promise<T>, ms: number, error: () => Error): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(error()), ms);
    timer.unref();
  });
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}

/** A backend exit is visible in `pg_stat_activity` a moment after the socket closes. */
const ON_DEMAND_DELAYS_MS = [0, 50, 200] as const;

/** Watches backend pids while tasks run on them. */
export class BackendWatch {
  private readonly watched = new Set<WatchedBackend>();
  private timer: NodeJS.Timeout | undefined;
  private checking: Promise<void> | undefined;
  /**
   * The backends the running check asks about: those watched when it began. A connection that
   * closed was among them; a lease added later got its connection after the close — on a pool of
   * one, the only connection, which the check's own question would wait for.
   */
  private scope: ReadonlySet<WatchedBackend> | undefined;
  /**
   * A check was asked for while one ran (another connection closed): the backends watched at that
   * moment, for one more round. Not those watched when the round starts: a lease added after that
   * close got its connection afterwards — on a pool of one, the only connection, which the round's
   * question would wait for while that lease's queries waited for the check.
   */
  private next: Set<WatchedBackend> | undefined;
  private polling = false;
  /** Backends whose probe is under way. */
  private readonly probing = new WeakSet<WatchedBackend>();

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
        // The last question still waits, for a free connection most likely: every connection of
        // the pool is busy (the app's own queries, other tasks). Ask each watched connection.
        else this.probe();
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

  /**
   * Resolves once no check that concerns `backend` is running (queries on watched connections
   * wait on this); undefined when none is. Without `backend`, any running check. A backend added
   * after a check began need not wait for it: its connection was handed out after the close that
   * started the check (or, for the round a later close added, after that close).
   */
  settled(backend?: WatchedBackend): Promise<void> | undefined {
    if (backend !== undefined && this.scope?.has(backend) !== true && !this.next?.has(backend))
      return undefined;
    return this.checking;
  }

  /**
   * Checks now (a connection just closed, say), asking again briefly until a dead one is found,
   * since a backend's exit shows a moment late. It asks about the backends watched now; a call
   * while a check runs shares it, and adds one more round for the backends watched then.
   */
  check(): Promise<void> {
    if (this.watched.size === 0) return Promise.resolve();
    if (this.checking !== undefined) {
      this.next ??= new Set();
      for (const backend of this.watched) this.next.add(backend);
      return this.checking;
    }
    this.scope = new Set(this.watched);
    // Started a microtask later, so that a close reported during the first question finds this
    // check running and asks for another round.
    this.checking = Promise.resolve()
      .then(async () => {
        const timeoutMs = this.options.checkTimeoutMs ?? CHECK_TIMEOUT_MS;
        for (;;) {
          await within(this.round(), timeoutMs, () =>
            Object.assign(
              new Error(
                `The check of the leased connections got no answer from the server within ${timeoutMs} ms`,
              ),
              { code: 'CONNECTION_CHECK_TIMEOUT' },
            ),
          );
          const next = this.next;
          this.next = undefined;
          if (next === undefined) break;
          this.scope = next;
        }
      })
      .catch((error: unknown) => this.failed(error))
      .finally(() => {
        this.checking = undefined;
        this.scope = undefined;
        this.next = undefined;
      });
    return this.checking;
  }

  /** One round of a check: asks about its scope until a dead backend is found (or none is left). */
  private async round(): Promise<void> {
    for (const delay of ON_DEMAND_DELAYS_MS) {
      if (delay > 0) await new Promise((resolve) => setTimeout(resolve, delay));
      if ((await this.once(this.scope)) !== 0) return;
    }
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

  /** Probes every live watched backend that has a probe and none under way. */
  private probe(): void {
    for (const backend of this.watched) {
      const { probe, fate } = backend;
      if (probe === undefined || fate.aborted || this.probing.has(backend)) continue;
      this.probing.add(backend);
      Promise.resolve()
        .then(probe)
        .then(undefined, (error: unknown) => {
          if (isConnectionLoss(error)) fate.abort(error);
        })
        .finally(() => this.probing.delete(backend));
    }
  }

  /**
   * One question to the server about the watched backends (those in `scope` only, when given);
   * returns how many were found gone (-1: none asked).
   */
  private async once(scope?: ReadonlySet<WatchedBackend>): Promise<number> {
    const live = [...this.watched].filter(
      (w) => w.pid !== undefined && !w.fate.aborted && (scope === undefined || scope.has(w)),
    );
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
