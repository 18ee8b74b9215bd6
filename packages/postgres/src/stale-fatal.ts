/**
 * Clearing postgres.js's stale FATAL: a connection that closed under a lease is reconnected by
 * lockkit at once, with a throwaway query that takes the FATAL.
 *
 * postgres.js 3.4 (`src/connection.js`) keeps a FATAL that arrived while a query ran — a backend
 * terminated by an operator, a failover, an idle timeout — for a ReadyForQuery that never comes,
 * and its `closed()` does not clear it: the slot's next connect hands the FATAL to the query it
 * connects for. When that is a `sql.reserve()`, the reserve rejects and its request stays queued,
 * so the reconnected connection is handed to the rejected promise and the slot is lost to the pool
 * (on a pool of one every later call waits forever). A pool lends such a connection whenever a
 * backend dies while idle and the client has not read the goodbye yet: the call that drew it fails
 * (`CONNECTION_LOST`), and the one after it must not.
 *
 * So a lease learns its connection from the first statement it runs (postgres.js hands the
 * connection to a query's `onexecute`), hears when postgres.js puts it in its closed queue (the
 * connection's `onclose`), and after a loss takes it from that queue, if no one has, and connects
 * it with a query of its own: the stale FATAL rejects that query instead (it is never sent), or,
 * with none pending, it runs `SELECT 1`; either way the slot comes back open. These are
 * postgres.js internals, each checked before use: where one is missing, nothing is done.
 *
 * @packageDocumentation
 */

/** A queue of postgres.js's pool (open, closed, reserved…), as used here. */
interface PostgresQueueLike {
  /** Removes `connection`; null when it was not there. */
  remove(connection: unknown): unknown;
}

/** A postgres.js connection, as its `onexecute` hands it over. */
interface PostgresConnectionLike {
  /** The pool queue it is in. */
  queue?: unknown;
  /** Connects, with `query` as the first to run (or to reject). */
  connect?: (query: unknown) => void;
  /** Called once, right after postgres.js moved it to its closed queue. */
  onclose?: ((error: unknown) => void) | null | undefined;
}

/**
 * Marks the rejection of a `sql.reserve()` postgres.js would have dropped (see
 * {@link staleFatalGuard}'s close hook): the request was never served, so asking again is safe.
 */
export const DROPPED_RESERVE = Symbol('lockkit.postgres.droppedReserve');

/** Whether `error` is the rejection of a reserve request postgres.js would have dropped. */
export const isDroppedReserve = (error: unknown): boolean =>
  typeof error === 'object' && error !== null && DROPPED_RESERVE in error;

/** A waiting `sql.reserve()` request, as postgres.js queues it. */
interface PostgresReserveRequestLike {
  reserve?: unknown;
  reject?: (error: unknown) => void;
}

/** A postgres.js query object before it is sent (it is sent on first `then`, unless executed). */
interface PostgresLazyQueryLike {
  executed?: boolean;
  catch(onRejected: (error: unknown) => void): unknown;
}

/** The part of the postgres.js instance used: a query to connect a slot with. */
export interface ReopenSqlLike {
  unsafe(text: string): unknown;
}

/** One lease's view of its connection; see the module comment. */
export interface StaleFatalGuard {
  /** Query options for the lease's first statement: they capture its connection. */
  readonly capture: { readonly onexecute: (connection: unknown) => boolean };
  /** After the lease's connection was lost: reconnects its slot when it sits closed and untaken. */
  reopen(): void;
  /** After a healthy release: stops listening for the connection's close. */
  forget(): void;
}

const isQueue = (value: unknown): value is PostgresQueueLike =>
  typeof value === 'object' &&
  value !== null &&
  typeof (value as PostgresQueueLike).remove === 'function';

/** A guard for one lease on `sql`'s pool. */
export function staleFatalGuard(sql: ReopenSqlLike): StaleFatalGuard {
  let connection: PostgresConnectionLike | undefined;
  // The closed queue postgres.js moved the connection to, as its `onclose` saw it.
  let closedIn: PostgresQueueLike | undefined;
  let hook: ((error: unknown) => void) | undefined;
  let previous: ((error: unknown) => void) | null | undefined;
  // Right after this hook, postgres.js's pool `onclose` reconnects the slot for the first waiting
  // request, taken off its queue. When that is a `sql.reserve()`, the connection's ReadyForQuery
  // drops it (it expects the request still queued), so it never settles — on a pool of one every
  // later call waits behind it. That connect is intercepted (only within this synchronous turn):
  // the slot is connected with a throwaway query instead, which also takes a stale FATAL, and the
  // reserve is rejected, marked, for its caller to ask again.
  const interceptReserve = (c: PostgresConnectionLike) => {
    const original = c.connect;
    if (typeof original !== 'function') return;
    const intercept = (request: unknown) => {
      c.connect = original;
      const r = request as PostgresReserveRequestLike | null | undefined;
      if (typeof r?.reserve !== 'function' || typeof r.reject !== 'function') {
        original.call(c, request);
        return;
      }
      const query = sql.unsafe('SELECT 1') as PostgresLazyQueryLike;
      query.executed = true;
      query.catch(() => {});
      original.call(c, query);
      const dropped = Object.assign(
        new Error('the pooled connection closed while this reserve waited for it; ask again'),
        { code: 'CONNECTION_CLOSED', [DROPPED_RESERVE]: true },
      );
      r.reject(dropped);
    };
    c.connect = intercept;
    queueMicrotask(() => {
      if (c.connect === intercept) c.connect = original;
    });
  };
  return {
    capture: {
      onexecute: (candidate) => {
        if (connection === undefined && typeof candidate === 'object' && candidate !== null) {
          const c = candidate as PostgresConnectionLike;
          if (typeof c.connect === 'function' && isQueue(c.queue)) {
            connection = c;
            previous = c.onclose;
            hook = (error) => {
              if (isQueue(c.queue)) closedIn = c.queue;
              if (typeof previous === 'function') previous(error);
              interceptReserve(c);
            };
            c.onclose = hook;
          }
        }
        // What postgres.js reads from `onexecute`: the connection may take more queries.
        return true;
      },
    },
    reopen: () => {
      const c = connection;
      if (c === undefined || closedIn === undefined || typeof c.connect !== 'function') return;
      // Taken already (a waiting query connected it): nothing of ours to do, nor safe to.
      if (closedIn.remove(c) === null) return;
      const query = sql.unsafe('SELECT 1') as PostgresLazyQueryLike;
      // Run by the connection itself, never through the pool's queue.
      query.executed = true;
      query.catch(() => {});
      c.connect(query);
    },
    forget: () => {
      if (connection !== undefined && connection.onclose === hook) connection.onclose = previous;
    },
  };
}
