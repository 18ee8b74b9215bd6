/**
 * Knowing when a postgres.js connection dies.
 *
 * postgres.js tells nobody that one particular reserved connection closed, and a query sent on a
 * closed reserved connection crashes the process (a TypeError thrown from a timer). So each lease
 * of a connection records its server pid, and a hook on the instance's `options.onclose` — called
 * with a connection id whenever any of its connections closes — asks the server which leased
 * pids are gone (through the pool, which can always reconnect the slot that just closed). Those
 * leases are marked dead: their signal aborts, nothing more is sent on them, and they are never
 * handed back to the pool. While a check runs, lease queries wait for its answer.
 */
import { type ConnectionFate, deadBackendsStatement } from '@lockkit/core/adapter';

/** The part of a postgres.js `sql` instance the watch uses. */
export interface WatchedSqlLike {
  unsafe(text: string, params?: unknown[]): PromiseLike<ArrayLike<unknown>>;
  readonly options: { onclose?: ((connectionId: number) => void) | null | undefined };
}

/** One leased connection being watched. */
export interface WatchedLease {
  /** Server pid of the connection (`pg_backend_pid()`), once known. */
  pid: number | undefined;
  /** Aborted when the connection is found dead. */
  readonly fate: ConnectionFate;
}

const watches = new WeakMap<object, ConnectionWatch>();

/** The watch of one postgres.js instance (created on first use, shared by its executors). */
export class ConnectionWatch {
  private readonly leases = new Set<WatchedLease>();
  private checking: Promise<void> | undefined;

  private constructor(private readonly sql: WatchedSqlLike) {
    const original = sql.options.onclose;
    sql.options.onclose = (connectionId: number) => {
      if (this.leases.size > 0) void this.check();
      if (typeof original === 'function') original(connectionId);
    };
  }

  /** The watch of `sql`, installing its close hook once. */
  static of(sql: WatchedSqlLike): ConnectionWatch {
    let watch = watches.get(sql);
    if (!watch) {
      watch = new ConnectionWatch(sql);
      watches.set(sql, watch);
    }
    return watch;
  }

  /** Starts watching a lease; the returned function stops. */
  add(lease: WatchedLease): () => void {
    this.leases.add(lease);
    return () => this.leases.delete(lease);
  }

  /** Resolves once no liveness check is running (lease queries wait on this). */
  settled(): Promise<void> | undefined {
    return this.checking;
  }

  /** Marks dead every watched lease whose backend is gone; repeats briefly, as exits lag. */
  private check(): Promise<void> {
    this.checking ??= (async () => {
      try {
        for (const delay of [0, 50, 200]) {
          if (delay) await new Promise((r) => setTimeout(r, delay));
          const watched = [...this.leases].filter((l) => l.pid !== undefined && !l.fate.aborted);
          if (watched.length === 0) return;
          const statement = deadBackendsStatement(watched.map((l) => l.pid as number));
          const rows = (await this.sql.unsafe(statement.text, [...statement.params])) as ArrayLike<{
            pid: number;
          }>;
          const dead = new Set(Array.from(rows, (r) => Number(r.pid)));
          for (const lease of watched) {
            if (dead.has(lease.pid as number)) {
              lease.fate.abort(
                Object.assign(new Error(`Connection to backend ${lease.pid} closed`), {
                  code: 'CONNECTION_CLOSED',
                }),
              );
            }
          }
          if (dead.size > 0) return;
        }
      } catch (error) {
        // The check itself failed: the server is unreachable, so no watched connection is usable.
        for (const lease of this.leases) lease.fate.abort(error);
      } finally {
        this.checking = undefined;
      }
    })();
    return this.checking;
  }
}
