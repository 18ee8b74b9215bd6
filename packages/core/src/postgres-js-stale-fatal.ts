/**
 * Absorbing postgres.js's stale FATAL: every reconnect of a connection lockkit knows runs a
 * throwaway query of lockkit's first, and only then serves the request it was made for.
 *
 * postgres.js 3.4 (`src/connection.js`) keeps an ErrorResponse that arrives while a query runs —
 * a backend's FATAL when it is terminated by an operator, a failover, an idle timeout — in the
 * connection's closure (`errorResponse`, with the `query` it came for) until that query's
 * ReadyForQuery. A terminated backend sends none, and the socket's `closed()` clears neither: at
 * the next connect the first ReadyForQuery (the new backend's, after authentication) finds them
 * and rejects the query the connect was made for (`initial`) with the old FATAL. Whoever connects
 * the slot next is hit, whatever the order of events: the pool's `onclose` reconnecting for the
 * first waiting request, a query or `sql.reserve()` drawing the slot from the closed queue, lockkit's
 * own dead-backend check. When that is a `sql.reserve()` still queued, the reserve rejects and is
 * later handed the connection anyway, which is lost to the pool. Independently, a reserve the
 * pool's `onclose` reconnects for is dropped at ReadyForQuery (it expects the request still
 * queued) and never settles.
 *
 * The state lives in the closure and cannot be cleared from outside; it can only be consumed. So
 * the connection's `connect` (what the pool calls for every reconnect) is wrapped: it connects with
 * a throwaway `SELECT 1` of lockkit's, which takes a stale FATAL if there is one (it is then never
 * sent) or runs. Either way the connection is then idle and healthy at that ReadyForQuery, and the
 * request it was connected for is served on it:
 * - a `sql.reserve()` that drew the slot from the closed queue is still in the pool's queue: the
 *   pool's `onopen`, which postgres.js calls next, serves it (or a request queued before it);
 * - any other request (a query drawing the slot, or the first waiting request the pool's
 *   `onclose` reconnects for, off its queue) is served by lockkit there and then, through
 *   postgres.js's own `connection.reserved` hook, called in place of the pool's `onopen`: a query
 *   is executed, a reserve handed the connection. Should the connect fail instead (server down,
 *   authentication), the request is rejected with that error, as postgres.js would.
 * A reserve request's hand-over is made idempotent: were it ever handed a second connection, that
 * one goes back to the pool (a throwaway round trip, then the pool's `onopen`), never lost.
 *
 * Connections are adopted when lockkit learns of them — a lease's first statement in
 * `@lockkit/postgres`, every statement of a lockkit transaction in `@lockkit/drizzle` (postgres.js
 * hands the connection to the query's `onexecute`) — and, from the first close of an adopted one
 * on, every connection that passes through the pool's closed queue; and every connection the pool
 * puts in a queue the shield has found (see `watchQueue`), the connecting queue among them — where
 * the pool puts a connection just before it connects it. Until that one is found, a connect made
 * for a `sql.reserve()` is postgres.js's alone: it sets the reserve aside for its array-type fetch,
 * and a link cut during the fetch leaves that fetch's rejection unhandled (which ends the process)
 * and the reserve unserved (its caller waits forever); made for lockkit's throwaway, the same cut
 * only reconnects. `ready()`, awaited before every reserve, finds it with lockkit's first call on a
 * pool with no open connection, and finds the closed queue in any case, by closing one connection
 * of its own once; after that, connects skip the array-type fetch (see `skipTypeRefetch`), whose
 * failure postgres.js leaves unhandled whatever the request. The shield also tells a lease
 * at once that its connection closed (a microtask after postgres.js reported it), so that
 * lockkit's dead-backend check need not ask the server about it. These are postgres.js internals, each
 * checked before use: where one is missing, nothing is wrapped and postgres.js behaves as it does.
 *
 * @packageDocumentation
 */

import { isConnectionLoss } from './connection-loss.js';

/** A queue of postgres.js's pool (open, closed, reserved…), as used here. */
interface PostgresQueueLike {
  push(item: unknown): unknown;
  shift(): unknown;
  remove(item: unknown): unknown;
}

/** A postgres.js connection, as its `onexecute` hands it over. */
interface PostgresConnectionLike {
  readonly id?: unknown;
  /** The pool queue it is in. */
  queue?: unknown;
  /** Connects, with `request` as the first query to run (or reserve to serve). */
  connect?: (request: unknown) => void;
  /** Runs a query now (or pipelines it); what the pool and `sql.reserve()` call. */
  execute?: (query: unknown) => unknown;
  /** Ends the connection at once: its socket closes, and the pool moves it to its closed queue. */
  terminate?: () => void;
  /**
   * Called at ReadyForQuery instead of the pool's `onopen` while set: with `release` set, always;
   * without it, only inside a transaction (when idle, postgres.js clears it and calls `onopen`).
   */
  reserved?: (((...args: never[]) => unknown) & { release?: boolean }) | null;
}

/** How long `ready()` waits for the pool to report the close of the connection it closed. */
const RECYCLE_WAIT_MS = 5000;

/** A request waiting in postgres.js's pool for a connection: a `sql.reserve()`. */
interface PostgresReserveRequestLike {
  reserve: (connection: unknown) => unknown;
  reject: (error: unknown) => unknown;
}

/** A postgres.js query object, as the wrapper drives it. */
interface PostgresQueryObjectLike {
  executed?: boolean;
  cancelled?: unknown;
  resolve?: (result: unknown) => unknown;
  reject?: (error: unknown) => unknown;
}

/** The part of the postgres.js instance used: the throwaway queries, the close hook. */
export interface ShieldSqlLike {
  unsafe(
    text: string,
    params?: unknown[],
    options?: { readonly onexecute?: (connection: unknown) => boolean },
  ): unknown;
  /** `sql.reserve()`: used by `ready()` only, for the one connection it closes. */
  reserve?: () => Promise<ShieldReservedLike>;
  readonly options: { onclose?: ((connectionId: number) => void) | null | undefined };
}

/** A reserved postgres.js `sql`, as `ready()` uses it. */
export interface ShieldReservedLike {
  unsafe(
    text: string,
    params?: unknown[],
    options?: { readonly onexecute?: (connection: unknown) => boolean },
  ): PromiseLike<unknown>;
  release(): void;
}

/** Lockkit's view of one postgres.js pool's connections; see the module comment. */
export interface StaleFatalShield {
  /** Query options for a lease's first statement: they adopt its connection. */
  readonly capture: { readonly onexecute: (connection: unknown) => boolean };
  /**
   * Calls `lost` (a microtask after postgres.js reported it, outside its close handling) when the
   * adopted `connection` closes, with the error postgres.js closed it with; returns the undo.
   */
  onClose(connection: unknown, lost: (error: unknown) => void): () => void;
  /**
   * What the shield knows of `connection` for the listener `lost` registered with
   * {@link StaleFatalShield.onClose}, synchronously: `'open'` (adopted — a close would be reported —
   * and none has been), `'closed'` (a close was reported, or is about to be, to `lost`), or
   * `'unknown'` (not adopted: postgres.js's internals were not as expected, and nothing reports
   * its close).
   */
  closeState(connection: unknown, lost: (error: unknown) => void): 'open' | 'closed' | 'unknown';
  /**
   * What a `sql.reserve()` must wait for first, or undefined: nothing once the shield sees every
   * connect of the pool before it starts. Until then, a connect made for a reserve runs
   * postgres.js's array-type fetch with the reserve set aside, and a link cut during that fetch
   * leaves the fetch's rejection unhandled (the process ends) and the reserve unserved for good.
   * The first call sends one query of its own through the pool, then reserves a connection and
   * closes it, to find the pool's queues; it rejects when that fails (the next call tries again).
   */
  ready(): Promise<void> | undefined;
}

const isQueue = (value: unknown): value is PostgresQueueLike =>
  typeof value === 'object' &&
  value !== null &&
  typeof (value as PostgresQueueLike).push === 'function' &&
  typeof (value as PostgresQueueLike).shift === 'function' &&
  typeof (value as PostgresQueueLike).remove === 'function';

const isConnection = (value: unknown): value is PostgresConnectionLike =>
  typeof value === 'object' &&
  value !== null &&
  typeof (value as PostgresConnectionLike).connect === 'function' &&
  typeof (value as PostgresConnectionLike).execute === 'function';

const isReserveRequest = (value: unknown): value is PostgresReserveRequestLike =>
  typeof value === 'object' &&
  value !== null &&
  typeof (value as PostgresReserveRequestLike).reserve === 'function' &&
  typeof (value as PostgresReserveRequestLike).reject === 'function';

/** Marks a reserve request whose hand-overs are already guarded. */
const GUARDED = Symbol('lockkit.postgres.guardedReserve');

/** A request whose connect is under way: served at the throwaway's ReadyForQuery, or failed. */
interface Pending {
  readonly request: unknown;
  /** The throwaway's rejection when it had one: the connect's own failure, or the stale FATAL. */
  failure?: { readonly error: unknown };
}

/** The shield of one postgres.js instance (see {@link staleFatalShield}). */
class Shield implements StaleFatalShield {
  private readonly adopted = new Map<unknown, PostgresConnectionLike>();
  private readonly pending = new Map<PostgresConnectionLike, Pending>();
  private closedQueueWrapped = false;
  /** The pool queues whose `push` adopts (see `watchQueue`). */
  private readonly watchedQueues = new WeakSet<object>();
  /** The pool's connecting queue is watched: every connection is adopted before it connects. */
  private connectsWatched = false;
  /** `ready()`'s work while it runs; `learned` once it is done (it is done once). */
  private learning: Promise<void> | undefined;
  private learned = false;
  /** Called once the closed queue is wrapped (see `recycle`). */
  private onClosedQueueWrapped: (() => void) | undefined;
  /** The connection the pool last drew from its closed queue (it connects it at once). */
  private drawn: unknown;
  private readonly listeners = new Map<unknown, Set<(error: unknown) => void>>();
  /** Listeners a close has been reported to (marked at once; they are called a microtask later). */
  private readonly reported = new WeakSet<(error: unknown) => void>();

  readonly capture = {
    onexecute: (candidate: unknown): boolean => {
      if (isConnection(candidate)) {
        this.adopt(candidate);
        if (isQueue(candidate.queue)) this.watchQueue(candidate.queue);
      }
      // What postgres.js reads from `onexecute`: the connection may take more queries.
      return true;
    },
  };

  constructor(private readonly sql: ShieldSqlLike) {}

  onClose(connection: unknown, lost: (error: unknown) => void): () => void {
    let set = this.listeners.get(connection);
    if (set === undefined) {
      set = new Set();
      this.listeners.set(connection, set);
    }
    const listeners = set;
    listeners.add(lost);
    return () => {
      listeners.delete(lost);
      if (listeners.size === 0 && this.listeners.get(connection) === listeners)
        this.listeners.delete(connection);
    };
  }

  closeState(connection: unknown, lost: (error: unknown) => void): 'open' | 'closed' | 'unknown' {
    if (this.reported.has(lost)) return 'closed';
    if (!isConnection(connection) || this.adopted.get(connection.id) !== connection)
      return 'unknown';
    return 'open';
  }

  /**
   * Called from the instance's `options.onclose` (with the closed connection's id), before the
   * pool reconnects that slot for a waiting request.
   */
  closed(connectionId: unknown): void {
    const c = this.adopted.get(connectionId);
    if (c === undefined) return;
    // Whoever leased it learns at once that it is gone (before any dead-backend check asks the
    // server), but not from inside postgres.js's close handling: a listener that queried the pool
    // there would draw this very connection before the pool reconnects it.
    const listeners = this.listeners.get(c);
    if (listeners !== undefined && listeners.size > 0) {
      const error = Object.assign(new Error(`Connection ${String(c.id)} closed`), {
        code: 'CONNECTION_CLOSED',
      });
      const now = [...listeners];
      for (const lost of now) this.reported.add(lost);
      queueMicrotask(() => {
        for (const lost of now) lost(error);
      });
    }
    // The pool has just moved it to its closed queue: from now on every connection that enters
    // or leaves that queue is adopted, those lockkit never leased included.
    if (!this.closedQueueWrapped && isQueue(c.queue)) this.wrapClosedQueue(c.queue);
    // Its connect failed (the throwaway was rejected and no ReadyForQuery followed): the request
    // it was made for fails with that error, as postgres.js would have failed it.
    const waiting = this.pending.get(c);
    if (waiting?.failure !== undefined) {
      this.pending.delete(c);
      c.reserved = null;
      this.fail(waiting.request, waiting.failure.error);
    }
  }

  ready(): Promise<void> | undefined {
    if (this.allConnectsAdopted() || this.learned) return undefined;
    this.learning ??= this.learnQueues().then(
      () => {
        this.learned = true;
      },
      (error: unknown) => {
        this.learning = undefined;
        throw error;
      },
    );
    return this.learning;
  }

  /** Whether every connect of the pool runs lockkit's throwaway first. */
  private allConnectsAdopted(): boolean {
    return this.closedQueueWrapped || this.connectsWatched;
  }

  /**
   * Finds the pool's queues, so that every later connect is lockkit's (see `ready`). First
   * `SELECT 1` through the pool. On a pool with no open connection, postgres.js connects one for it
   * and runs it as the connect's own request (a link cut during the array-type fetch then
   * reconnects for it, which is harmless); handed over to be sent only after the connect's round
   * trips, hence after a turn of the event loop, it finds its connection still in the connecting
   * queue, where the pool puts every connection just before it connects it: watched from then on.
   * Sent at once instead (an open connection took it), it finds no connect to learn from. Then, in
   * either case, lockkit reserves a connection — which nobody else can be handed — and closes it:
   * the close puts it in the pool's closed queue, which every connect draws from, and which is
   * wrapped then (one connection reconnects once in the life of the pool). A failure (no server)
   * rejects: the caller's call fails with it, and the next call tries again, for a reserve made
   * before would be postgres.js's alone.
   */
  private async learnQueues(): Promise<void> {
    let turned = false;
    const turn = setImmediate(() => {
      turned = true;
    });
    try {
      await this.sql.unsafe('SELECT 1', [], {
        onexecute: (candidate: unknown) => {
          // `capture` watches the queue the connection is in: here, the connecting one.
          if (turned && isConnection(candidate) && isQueue(candidate.queue))
            this.connectsWatched = true;
          return this.capture.onexecute(candidate);
        },
      });
    } finally {
      clearImmediate(turn);
    }
    if (!this.closedQueueWrapped) await this.recycle();
  }

  /**
   * Reserves a connection and closes it (see `learnQueues`); resolves once the pool reported the
   * close (its closed queue is then wrapped), or after a few seconds if it never does (its
   * internals not as expected).
   */
  private async recycle(): Promise<void> {
    const reserve = this.sql.reserve;
    if (typeof reserve !== 'function') return;
    const reserved = await reserve.call(this.sql);
    let connection: PostgresConnectionLike | undefined;
    try {
      await reserved.unsafe('SELECT 1', [], {
        onexecute: (candidate: unknown) => {
          if (isConnection(candidate)) connection = candidate;
          return this.capture.onexecute(candidate);
        },
      });
    } catch (error) {
      // A lost connection is in postgres.js's closed queue already (or about to be): not handed
      // back, or the next query on it would crash the process.
      if (!isConnectionLoss(error)) reserved.release();
      throw error;
    }
    if (
      connection === undefined ||
      typeof connection.terminate !== 'function' ||
      this.adopted.get(connection.id) !== connection
    ) {
      reserved.release();
      return;
    }
    const wrapped = new Promise<void>((resolve) => {
      const timer = setTimeout(resolve, RECYCLE_WAIT_MS);
      this.onClosedQueueWrapped = () => {
        clearTimeout(timer);
        resolve();
      };
    });
    // Still reserved, so nobody can draw it; never released: the close moves it to the closed
    // queue, from where the pool reconnects it when it needs it (through lockkit's throwaway).
    connection.terminate();
    await wrapped;
    this.onClosedQueueWrapped = undefined;
  }

  /**
   * Adopts every connection the pool puts in `queue` from now on (before anything else happens to
   * it: the pool connects a connection right after putting it in its connecting queue), and
   * watches the queue each one leaves: postgres.js moves a connection by pushing it onto its new
   * queue before it records the move, so the connection still names the queue it leaves. Every
   * queue a connection passes through is found so, the connecting queue at the latest when the
   * first connect after this one completes.
   */
  private watchQueue(queue: PostgresQueueLike): void {
    if (this.watchedQueues.has(queue)) return;
    this.watchedQueues.add(queue);
    const push = queue.push.bind(queue);
    queue.push = (item: unknown) => {
      if (isConnection(item)) {
        this.adopt(item);
        if (isQueue(item.queue)) this.watchQueue(item.queue);
      }
      return push(item);
    };
  }

  private wrapClosedQueue(queue: PostgresQueueLike): void {
    this.closedQueueWrapped = true;
    this.onClosedQueueWrapped?.();
    const push = queue.push.bind(queue);
    const shift = queue.shift.bind(queue);
    queue.push = (item: unknown) => {
      if (isConnection(item)) this.adopt(item);
      return push(item);
    };
    queue.shift = () => {
      const item = shift();
      if (isConnection(item)) this.adopt(item);
      this.drawn = item;
      return item;
    };
  }

  /** Wraps `c.connect` (once): see the module comment. */
  private adopt(c: PostgresConnectionLike): void {
    if (this.adopted.get(c.id) === c) return;
    const original = c.connect;
    if (typeof original !== 'function') return;
    this.adopted.set(c.id, c);
    c.connect = (request: unknown) => {
      this.skipTypeRefetch();
      const throwaway = this.throwaway();
      if (throwaway === undefined) {
        original.call(c, request);
        return;
      }
      // Drawn from the closed queue by `sql.reserve()`, the request is still in the pool's queue:
      // the pool's `onopen` serves it (or one queued before it) once the throwaway is done. Should
      // this connect fail, the pool's `onclose` reconnects the slot for the first waiting request,
      // taken off the queue: that connect, served or failed by lockkit, settles it.
      const drawn = this.drawn === c;
      if (drawn) this.drawn = undefined;
      if (drawn && isReserveRequest(request)) {
        this.guard(request);
        throwaway.resolve = () => undefined;
        throwaway.reject = () => undefined;
        original.call(c, throwaway);
        return;
      }
      if (isReserveRequest(request)) this.guard(request);
      const waiting: Pending = { request };
      this.pending.set(c, waiting);
      // Called by postgres.js at the ReadyForQuery after the throwaway, in place of the pool's
      // `onopen`: the connection is idle and clean, and still in the pool's connecting queue.
      const handOver = Object.assign(
        () => {
          if (c.reserved === handOver) c.reserved = null;
          if (this.pending.get(c) === waiting) this.pending.delete(c);
          this.serve(c, request);
        },
        { release: true },
      );
      // Both are called synchronously by postgres.js: `resolve` at the throwaway's own
      // ReadyForQuery; `reject` with the stale FATAL at the new backend's first ReadyForQuery
      // (which then goes on to `connection.reserved`), or when the connect itself fails (the
      // socket then closes: see `closed`).
      throwaway.resolve = () => {
        c.reserved = handOver;
      };
      throwaway.reject = (error: unknown) => {
        waiting.failure = { error };
        c.reserved = handOver;
      };
      original.call(c, throwaway);
    };
  }

  /**
   * Once the pool has fetched its array types and every connect is lockkit's, connects skip the
   * fetch (`fetch_types` off). postgres.js fetches on every connect, though the types it learns
   * are the pool's, shared by its connections; and it drops the fetch's promise, so a fetch that
   * fails — a link reset, a FATAL from a restart or a terminated backend while it runs — is an
   * unhandled rejection, which ends the process. Not before every connect is lockkit's: a connect
   * postgres.js makes for a `sql.reserve()` without the fetch never serves the reserve.
   */
  private skipTypeRefetch(): void {
    const options = this.sql.options as {
      fetch_types?: unknown;
      shared?: { typeArrayMap?: unknown };
    };
    const types = options.shared?.typeArrayMap;
    if (
      options.fetch_types === true &&
      this.closedQueueWrapped &&
      typeof types === 'object' &&
      types !== null &&
      Object.keys(types).length > 0
    )
      options.fetch_types = false;
  }

  /** A `SELECT 1` postgres.js never sends through the pool (it is run by one connection). */
  private throwaway(): PostgresQueryObjectLike | undefined {
    const query = this.sql.unsafe('SELECT 1') as PostgresQueryObjectLike | null | undefined;
    if (typeof query !== 'object' || query === null) return undefined;
    query.executed = true;
    return query;
  }

  /** Serves on the idle connection `c` the request it was connected for. */
  private serve(c: PostgresConnectionLike, request: unknown): void {
    if (isReserveRequest(request)) {
      request.reserve(c);
      return;
    }
    const query = request as PostgresQueryObjectLike | null | undefined;
    // Cancelled while the connection was being made: the connection goes back to the pool.
    if (query === null || query === undefined || query.cancelled) {
      this.giveBack(c);
      return;
    }
    c.execute?.(query);
  }

  private fail(request: unknown, error: unknown): void {
    const r = request as PostgresQueryObjectLike | PostgresReserveRequestLike | null | undefined;
    if (typeof r?.reject === 'function') r.reject(error);
  }

  /**
   * Makes a reserve request's hand-over happen once: served here, it may still sit in the pool's
   * queue, and the pool would later hand it a second connection, lost with the settled promise.
   */
  private guard(request: PostgresReserveRequestLike & { [GUARDED]?: true }): void {
    if (request[GUARDED]) return;
    request[GUARDED] = true;
    const reserve = request.reserve;
    const reject = request.reject;
    let settled = false;
    request.reserve = (connection: unknown) => {
      if (settled) {
        if (isConnection(connection)) this.giveBack(connection);
        return undefined;
      }
      settled = true;
      return reserve(connection);
    };
    request.reject = (error: unknown) => {
      if (settled) return undefined;
      settled = true;
      return reject(error);
    };
  }

  /**
   * Hands the idle connection `c` back to the pool, from where postgres.js can call nothing for it
   * (the pool's `onopen` is private): a throwaway runs on it under a `reserved` hook without
   * `release`, which postgres.js clears at the idle ReadyForQuery and then calls `onopen`.
   */
  private giveBack(c: PostgresConnectionLike): void {
    const throwaway = this.throwaway();
    if (throwaway === undefined || typeof c.execute !== 'function') return;
    (throwaway as { catch?: (f: () => void) => unknown }).catch?.(() => {});
    c.reserved = () => undefined;
    c.execute(throwaway);
  }
}

const shields = new WeakMap<object, Shield>();

/**
 * The shield of `sql`'s pool (created on first use, shared by its executors: keyed by the pool's
 * options object, which every handle on one pool shares), hooked on its `options.onclose`.
 */
export function staleFatalShield(sql: ShieldSqlLike): StaleFatalShield {
  const pool: object = sql.options;
  let shield = shields.get(pool);
  if (shield === undefined) {
    const created = new Shield(sql);
    const original = sql.options.onclose;
    sql.options.onclose = (connectionId: number) => {
      created.closed(connectionId);
      if (typeof original === 'function') original(connectionId);
    };
    shields.set(pool, created);
    shield = created;
  }
  return shield;
}
