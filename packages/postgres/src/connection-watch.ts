/**
 * Knowing when a postgres.js connection dies.
 *
 * postgres.js tells nobody that one particular reserved connection closed, and a query sent on a
 * closed reserved connection crashes the process (a TypeError thrown from a timer). So each lease
 * of a connection records its server pid, and a hook on the instance's `options.onclose` — called
 * with a connection id whenever any of its connections closes — asks core's {@link BackendWatch}
 * to check which leased pids are gone (through the pool, which can always reconnect the slot that
 * just closed). Those leases are marked dead: their signal aborts, nothing more is sent on them,
 * and they are never handed back to the pool (one whose socket postgres.js still holds open is
 * ended: its backend may be alive). While a check runs, lease queries wait for it — at most the
 * watch's `checkTimeoutMs`: a pool that cannot connect may never answer, and a check without an
 * answer counts as a failed one. A failing check means the server is unreachable, or may be: no
 * watched connection is trusted (a partitioned one would keep its lock while another node took it
 * over once the server dropped its backend).
 *
 * A lease leaves the watch once core's postgres.js shield adopts its connection (its first
 * statement): the shield then reports that connection's own close to it, synchronously marked, so
 * it neither waits for a check about other connections nor is ended by one that fails. Waiting
 * deadlocked on a full pool — the check's question queued for a connection behind leases that
 * waited for the check — and the failed check then ended every live lease. The watch remains for
 * a lease whose connection the shield could not adopt (postgres.js internals not as expected).
 */
import { BackendWatch, type WatchedBackend } from '@lockkit/core/adapter';

/** The part of a postgres.js `sql` instance the watch uses. */
export interface WatchedSqlLike {
  unsafe(text: string, params?: unknown[]): PromiseLike<ArrayLike<unknown>>;
  readonly options: { onclose?: ((connectionId: number) => void) | null | undefined };
}

/** One leased connection being watched. */
export type WatchedLease = WatchedBackend;

const watches = new WeakMap<object, BackendWatch>();

/** The watch of one postgres.js instance (created on first use, shared by its executors). */
export const ConnectionWatch = {
  /** The watch of `sql`, installing its close hook once. */
  of(sql: WatchedSqlLike): BackendWatch {
    let watch = watches.get(sql);
    if (!watch) {
      const created = new BackendWatch(
        async (text, params) => await sql.unsafe(text, [...params]),
        { onCheckFailure: 'abort' },
      );
      const original = sql.options.onclose;
      sql.options.onclose = (connectionId: number) => {
        void created.check();
        if (typeof original === 'function') original(connectionId);
      };
      watches.set(sql, created);
      watch = created;
    }
    return watch;
  },
};
