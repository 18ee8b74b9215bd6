/**
 * The postgres.js executor: every operation on a connection reserved with `sql.reserve()`,
 * released in `finally` (or, when the connection died, left to postgres.js to reconnect).
 *
 * Transactions are opened with one simple-protocol query — `BEGIN; <core's first statement>`, with
 * `SELECT pg_backend_pid()` between them unless that statement reports the pid itself — so a lock
 * decision costs two round trips, where `sql.begin` would
 * await BEGIN first (three). The driver types are structural: this package never imports
 * `postgres`.
 */
import {
  CommitRolledBackError,
  type LockExecutor,
  LockkitError,
  type QueryFn,
  type Row,
  type SessionContext,
  type TransactionContext,
} from '@lockkit/core';
import {
  BACKEND_PID,
  ConnectionFate,
  END_OWN_BACKEND,
  FateTransactionContext,
  isConnectionLoss,
  NestedCallGuard,
  RESET_AUTHORIZATION,
  SESSION_RESET,
  staleFatalShield,
  TaskFailure,
} from '@lockkit/core/adapter';
import { ConnectionWatch, type WatchedLease } from './connection-watch.js';

/** A postgres.js result: rows, plus the connection's BackendKeyData as `state`. */
export interface PostgresResultLike extends ArrayLike<unknown> {
  readonly command?: string;
  readonly state?: { readonly pid?: number | null } | null;
}

/** The part of a reserved postgres.js `sql` we use. */
export interface PostgresReservedLike {
  /**
   * `options.onexecute` (postgres.js's own, as `sql.begin` uses it) is handed the connection the
   * statement runs on: lockkit wraps its reconnects (see `postgres-js-stale-fatal.ts` in `@lockkit/core`).
   */
  unsafe(
    text: string,
    params?: unknown[],
    options?: {
      readonly prepare?: boolean;
      readonly onexecute?: (connection: unknown) => boolean;
    },
  ): PromiseLike<PostgresResultLike> & { cancel?: () => unknown };
  release(): void;
}

/** The part of a postgres.js `sql` instance we use. */
export interface PostgresSqlLike<R extends PostgresReservedLike = PostgresReservedLike> {
  unsafe(text: string, params?: unknown[]): PromiseLike<ArrayLike<unknown>>;
  reserve(): Promise<R>;
  readonly options: {
    onclose?: ((connectionId: number) => void) | null | undefined;
    /** The pool size: with one connection, a wait is cancelled with the protocol's own request. */
    readonly max?: number;
  };
}

/**
 * The parts of a running postgres.js query its cancel uses: `active` while the server runs it, and
 * `canceller`, postgres.js's own cancel, whose promise settles once the server has closed the
 * CancelRequest's socket (after signalling the backend). Internal to postgres.js, hence optional.
 */
interface PostgresQueryLike {
  readonly active?: boolean;
  canceller?: ((query: PostgresQueryLike) => PromiseLike<unknown>) | null;
  cancel?: () => unknown;
  /** Sends the query (called by postgres.js once the query is awaited). */
  handler?: (query: PostgresQueryLike) => unknown;
  resolve?: (result: unknown) => unknown;
  /** The query's text parts (one for `unsafe`), and whether it goes by the simple protocol. */
  readonly strings?: readonly string[];
  readonly options?: { readonly simple?: boolean };
  reject?: (error: unknown) => void;
}

/**
 * What a task's own statements said about lockkit's transaction, from their command tags: `'no'`
 * nothing ended it; `'yes'` a COMMIT (or PREPARE TRANSACTION) ended it; `'maybe'` a ROLLBACK
 * tag (a whole rollback, or only ROLLBACK TO SAVEPOINT) or a `begin()` of its own on the handle.
 */
type TransactionEnd = 'no' | 'yes' | 'maybe';

/**
 * Whether a simple-protocol query's text may hold several statements: postgres.js then reports
 * only the last one's command tag, and a COMMIT before it would go unseen.
 */
function maySeveral(text: unknown): boolean {
  return typeof text === 'string' && text.trim().replace(/;+$/, '').includes(';');
}

function endOf(tag: unknown): TransactionEnd {
  if (tag === 'COMMIT' || tag === 'PREPARE TRANSACTION') return 'yes';
  return tag === 'ROLLBACK' ? 'maybe' : 'no';
}

/** Options of {@link postgresExecutor}. */
export interface PostgresExecutorOptions {
  /** Name reported in errors; default `'postgres'`. */
  readonly name?: string;
  /**
   * Declare a transaction-pooling proxy (PgBouncer in transaction mode, Supavisor, …): session
   * scope is then refused before any SQL. Create the postgres.js instance with `prepare: false`
   * there (with `prepare: true` postgres.js hangs behind PgBouncer).
   */
  readonly transactionPooler?: boolean;
}

/** Rows of the last statement of a (possibly multi-statement) result. */
function lastRows(result: PostgresResultLike): Row[] {
  if (typeof result.command === 'string' || result.length === 0) return Array.from(result) as Row[];
  return Array.from(result[result.length - 1] as ArrayLike<Row>);
}

interface Lease<R> {
  readonly reserved: R;
  readonly watched: WatchedLease;
  readonly query: QueryFn;
  /** The user's handle: refuses to send on a dead connection (postgres.js would crash). */
  readonly handle: R;
  readonly stop: () => void;
  /**
   * What a statement on the lease waits for before it is sent: a running dead-backend check
   * that concerns it, unless the lease learns of its own connection's close directly.
   */
  readonly beforeSend: () => Promise<void> | undefined;
  /** The protocol cancel of the running statement (pools of one only). */
  readonly interrupt: (() => Promise<void>) | undefined;
  /** True once the connection must not go back to the pool (not known clean). */
  readonly discarded: () => boolean;
  readonly discard: () => void;
  /** Whether the task's own statements ended the transaction (see {@link TransactionEnd}). */
  readonly ended: () => boolean | undefined;
  /** Options of the lease's first statement: they capture its connection. */
  readonly capture: { readonly onexecute: (connection: unknown) => boolean };
  /**
   * Whether postgres.js may still hold the connection open: it was captured, and postgres.js has
   * not reported it closed. Only then may anything more be sent on it once its fate is aborted.
   */
  readonly mayBeOpen: () => boolean;
  /**
   * A statement on the connection failed with a lost connection: nothing more is sent on it (see
   * `mayBeOpen`), and its fate is aborted with `reason`.
   */
  readonly lostOnWire: (reason: unknown) => void;
}

/**
 * A {@link LockExecutor} over a postgres.js instance (`postgres(url, options)`).
 *
 * Capabilities: transaction, session (`sql.reserve()`), BEGIN + first statement in one round
 * trip. Tasks receive the reserved `sql` of the lock's connection, inside its transaction.
 *
 * @example
 * ```ts
 * import postgres from 'postgres';
 * import { createLockClient } from '@lockkit/core';
 * import { postgresExecutor } from '@lockkit/postgres';
 * const locks = createLockClient(postgresExecutor(postgres(process.env.DATABASE_URL)));
 * ```
 */
export function postgresExecutor<R extends PostgresReservedLike>(
  sql: PostgresSqlLike<R>,
  options: PostgresExecutorOptions = {},
): LockExecutor<R, R> {
  // A TransactionSql (the `sql` inside `sql.begin`) has neither the pool's
  // options nor `reserve`: lockkit needs the instance itself.
  const candidate = sql as Partial<PostgresSqlLike<R>> | null | undefined;
  if (
    typeof candidate?.reserve !== 'function' ||
    typeof candidate.options !== 'object' ||
    candidate.options === null
  ) {
    throw new LockkitError(
      'EXECUTOR_INVALID',
      'postgresExecutor needs the postgres.js instance (postgres(url)), not the sql of a transaction: lockkit opens its own transactions on it.',
    );
  }
  const watch = ConnectionWatch.of(sql);
  // postgres.js hands a dead connection's FATAL to the next request its slot reconnects for.
  const shield = staleFatalShield(sql);

  // A pool of one: a lockkit call from inside a task could never get a connection.
  const nested = new NestedCallGuard(options.name ?? 'postgres', sql.options.max === 1, sql);

  async function lease(): Promise<Lease<R>> {
    nested.check();
    // Until the shield sees the pool's connects, a reserve that connects is at postgres.js's
    // mercy (a link cut during its array-type fetch ends the process and loses the reserve).
    const learning = shield.ready();
    if (learning !== undefined) await learning;
    const reserved = await sql.reserve();
    const watched: WatchedLease = { pid: undefined, fate: new ConnectionFate() };
    const unwatch = watch.add(watched);
    const stop = () => {
      unwatch();
      unwatchClose?.();
    };
    const { fate } = watched;
    const gone = () => fate.reason ?? new Error('connection closed');
    let pending: { cancel?: () => unknown } | undefined;
    // A statement of this lease failed with a lost connection: its socket errored (a reset), and
    // postgres.js reports the close only later; nothing more may be sent on it meanwhile.
    let wireLost = false;
    const lostOnWire = (reason: unknown) => {
      wireLost = true;
      fate.abort(reason);
    };
    // The command tags of the statements sent in a transaction: a COMMIT or ROLLBACK of its own.
    let transactionEnd: TransactionEnd = 'no';
    // A failed statement may have been the task's own COMMIT (a deferred constraint) or PREPARE
    // TRANSACTION, which ends the transaction with an error and no tag; a multi-statement query
    // shows only its last tag: ask the server.
    const failed = () => {
      if (transactionEnd === 'no') transactionEnd = 'maybe';
    };
    const note = (result: unknown) => {
      for (const part of Array.isArray(result) && !('command' in result) ? result : [result]) {
        const end = endOf((part as { command?: unknown } | null)?.command);
        if (end === 'yes' || (end === 'maybe' && transactionEnd === 'no')) transactionEnd = end;
      }
    };
    const query: QueryFn = async (text, params) => {
      await beforeSend();
      if (fate.aborted) throw gone();
      if ((params === undefined || params.length === 0) && maySeveral(text)) failed();
      const running = reserved.unsafe(text, params === undefined ? [] : [...params]);
      pending = running;
      try {
        const result = await running;
        note(result);
        return lastRows(result);
      } catch (error) {
        failed();
        if (isConnectionLoss(error)) lostOnWire(error);
        throw error;
      } finally {
        if (pending === running) pending = undefined;
      }
    };
    // postgres.js sends a CancelRequest on a socket of its own: on a pool of one, the only way.
    // Its promise settles when the server has closed that socket, which it does only after
    // signalling the backend: awaited (core awaits `interrupt` before sending anything more on
    // the connection), the cancel can only land on the statement it was meant for, never on a
    // later one, so the connection needs no ending afterwards (and keeps its slot warm).
    let discarded = false;
    let unwatchClose: (() => void) | undefined;
    let closeSeen = false;
    // The connection postgres.js runs this lease's statements on, once its first one ran.
    let connection: unknown;
    const lost = (error: unknown) => {
      closeSeen = true;
      fate.abort(error);
    };
    // What a statement waits for before it is sent. Nothing once the shield reports this very
    // connection's close (it is adopted and has not closed): the dead-backend check asks about
    // other connections, and waiting for it here deadlocks when every connection of the pool is
    // leased — the check's question queues behind them for a connection, they wait for the
    // check, and after its timeout every lease of the pool was declared dead, live ones holding
    // their locks included (seen in `pnpm chaos`: a worker lost every run for good, each close
    // starting the next check). A close the shield has seen ends the lease at once.
    const beforeSend = (): Promise<void> | undefined => {
      const state = connection === undefined ? 'unknown' : shield.closeState(connection, lost);
      if (state === 'open') return undefined;
      if (state === 'closed') {
        lost(Object.assign(new Error('Connection closed'), { code: 'CONNECTION_CLOSED' }));
        return undefined;
      }
      return watch.settled(watched);
    };
    const interrupt =
      sql.options.max === 1
        ? async () => {
            const running = pending as PostgresQueryLike | undefined;
            if (running === undefined) return;
            // `query.cancel()` drops the promise of its CancelRequest; postgres.js's canceller
            // (what `cancel()` calls) returns it. A statement that is not running gets no
            // CancelRequest, and its canceller's promise never settles: await only a sent one.
            const { canceller } = running;
            if (running.active !== true || typeof canceller !== 'function') {
              running.cancel?.();
              return;
            }
            running.canceller = null;
            await Promise.resolve(canceller(running)).catch(() => undefined);
          }
        : undefined;
    // postgres.js sends a query from its `handler`, a microtask after the query is awaited. A
    // connection postgres.js has closed, before the watch has said whose it was, would take it
    // and crash the process (a TypeError from a timer) or never answer: the handler waits for a
    // running check and sends only on a connection not known dead.
    const held = <Q>(query: Q): Q => {
      const q = query as unknown as PostgresQueryLike;
      const send = q.handler;
      if (typeof send !== 'function') return query;
      q.handler = (self) => {
        const { resolve, reject } = self;
        if (self.options?.simple === true && maySeveral(self.strings?.[0])) failed();
        if (typeof resolve === 'function') {
          self.resolve = (result) => {
            note(result);
            return resolve.call(self, result);
          };
        }
        if (typeof reject === 'function') {
          self.reject = (error) => {
            failed();
            if (isConnectionLoss(error)) wireLost = true;
            reject.call(self, error);
          };
        }
        const checking = beforeSend();
        if (checking === undefined && !fate.aborted) return send(self);
        void Promise.resolve(checking).then(() => {
          if (fate.aborted) self.reject?.(gone());
          else send(self);
        });
        return undefined;
      };
      return query;
    };
    const guard = <F extends (...args: never[]) => unknown>(fn: F): F =>
      ((...args: Parameters<F>) => {
        if (fate.aborted) throw gone();
        return held(fn(...args));
      }) as F;
    const handle = new Proxy(reserved, {
      apply: (target, thisArg, args) => {
        if (fate.aborted) throw gone();
        return held(
          Reflect.apply(target as unknown as (...a: unknown[]) => unknown, thisArg, args),
        );
      },
      get: (target, property, receiver) => {
        const value = Reflect.get(target, property, receiver) as unknown;
        if ((property === 'unsafe' || property === 'file') && typeof value === 'function') {
          return guard((value as (...a: never[]) => unknown).bind(target));
        }
        // A transaction of the task's own on lockkit's connection: its COMMIT is not seen here.
        if ((property === 'begin' || property === 'savepoint') && typeof value === 'function') {
          return (...args: unknown[]) => {
            if (transactionEnd === 'no') transactionEnd = 'maybe';
            return Reflect.apply(value as (...a: unknown[]) => unknown, target, args);
          };
        }
        return value;
      },
    });
    return {
      reserved,
      watched,
      query,
      handle,
      stop,
      beforeSend,
      interrupt,
      discarded: () => discarded,
      discard: () => {
        discarded = true;
      },
      ended: () => (transactionEnd === 'no' ? false : transactionEnd === 'yes' ? true : undefined),
      capture: {
        onexecute: (candidate) => {
          const adopted = shield.capture.onexecute(candidate);
          if (unwatchClose === undefined) {
            connection = candidate;
            unwatchClose = shield.onClose(candidate, lost);
            // Its close is reported to it directly from now on: the check need not ask about
            // it, and a check that fails (its question unanswered) says nothing about it.
            if (shield.closeState(candidate, lost) === 'open') unwatch();
          }
          return adopted;
        },
      },
      mayBeOpen: () => unwatchClose !== undefined && !closeSeen && !wireLost,
      lostOnWire,
    };
  }

  /**
   * Ends a lease's backend from its own connection: rolled back first (it may be in a
   * transaction; outside one, ROLLBACK only warns), back to the authenticated user (a task may have
   * switched to a role that may not end its own backend), then ended. Every error is ignored: a
   * link that is really gone answers nothing, and postgres.js fails these once it reads the close.
   */
  async function endBackend(l: Lease<R>): Promise<void> {
    const quietly = (text: string) =>
      l.reserved.unsafe(text).then(
        () => {},
        () => {},
      );
    await quietly('ROLLBACK');
    for (const statement of RESET_AUTHORIZATION) await quietly(statement);
    await quietly(END_OWN_BACKEND);
  }

  async function finish(l: Lease<R>): Promise<void> {
    if (l.watched.fate.aborted && l.mayBeOpen()) {
      // Declared dead while postgres.js still has the connection open: the watch's check failed
      // or got no answer (the pool could not connect), or the server listed its backend gone a
      // moment before the socket closed. The backend may be alive, in the transaction, holding
      // the lock: it is ended — rolled back, unlocked — and never lent again. Not awaited: a link
      // that is really gone answers nothing (postgres.js fails these once it reads the close).
      l.stop();
      void endBackend(l);
      return;
    }
    if (l.discarded() && !l.watched.fate.aborted) {
      // Not to be lent on as it is: reset it — settings (custom ones too), role, locks, LISTEN,
      // temporary objects, sequences, SQL prepared statements — and lend it on. Not DISCARD ALL:
      // dropping the statements postgres.js prepared itself corrupts its queue. Only a
      // connection the reset fails on is ended.
      const reset = await l.reserved.unsafe(SESSION_RESET).then(
        () => 'done' as const,
        (error: unknown) => (isConnectionLoss(error) ? ('lost' as const) : ('failed' as const)),
      );
      if (reset === 'done' && !l.watched.fate.aborted) {
        l.stop();
        l.reserved.release();
        return;
      }
      // The link died under the reset: nothing more may be sent on it (postgres.js would never
      // answer, or crash the process from a timer writing to its closed socket); it is in
      // postgres.js's closed queue already, and the server rolls back and unlocks on its own.
      if (reset === 'lost' || l.watched.fate.aborted) {
        l.stop();
        return;
      }
      // The reset failed: ended.
      await endBackend(l);
      // Ended: postgres.js has put it in its closed queue already; releasing it would reopen it.
      l.stop();
      return;
    }
    l.stop();
    // A dead reserved connection is already (or, its socket errored, about to be) in postgres.js's
    // closed queue; releasing it would list it as open, and the next query on it would crash.
    // postgres.js reconnects the slot; the FATAL it died with is taken by lockkit's throwaway
    // (see `postgres-js-stale-fatal.ts` in `@lockkit/core`), never by the next caller.
    if (!l.watched.fate.aborted) l.reserved.release();
  }

  async function inTransaction<T>(
    opening: string | undefined,
    fn: (ctx: TransactionContext<R>, openingRows: Row[]) => Promise<T>,
    beforeSend?: () => void,
  ): Promise<T> {
    const l = await lease();
    const { fate } = l.watched;
    // Nothing sent yet: nothing to roll back.
    let inTransactionBlock = false;
    try {
      beforeSend?.();
      inTransactionBlock = true;
      // One simple-protocol query, one round trip: BEGIN, our pid (for the watch), core's opening
      // — which reports the pid itself when it starts with BACKEND_PID.
      const reportsPid = opening?.startsWith(BACKEND_PID) === true;
      const texts = [
        'BEGIN',
        ...(reportsPid ? [] : [BACKEND_PID]),
        ...(opening === undefined ? [] : [opening]),
      ];
      const results = (await l.reserved.unsafe(
        texts.join('; '),
        [],
        l.capture,
      )) as unknown as PostgresResultLike[];
      const openingRows = opening === undefined ? [] : Array.from(results.at(-1) as ArrayLike<Row>);
      l.watched.pid = Number(
        (reportsPid ? openingRows : Array.from(results[1] as ArrayLike<Row>))[0]?.pid,
      );
      const ctx = new FateTransactionContext(l.query, l.handle, fate);
      if (l.interrupt) ctx.interrupt = l.interrupt;
      ctx.ended = l.ended;
      const result = await nested.run(() => fn(ctx, openingRows));
      await l.beforeSend();
      if (fate.aborted) throw fate.reason;
      const committed = await l.reserved.unsafe('COMMIT');
      if (committed.command === 'ROLLBACK') {
        inTransactionBlock = false;
        throw new CommitRolledBackError(
          "COMMIT answered ROLLBACK: a statement of the task's transaction had failed (perhaps one the task caught), so nothing was written. The lock is released.",
        );
      }
      return result;
    } catch (error) {
      // A task that hit the dead connection itself: no ROLLBACK on it (it would never answer).
      if (isConnectionLoss(error)) l.lostOnWire(error instanceof TaskFailure ? error.error : error);
      if (!fate.aborted && inTransactionBlock) await l.query('ROLLBACK').catch(() => {});
      throw error;
    } finally {
      await finish(l);
    }
  }

  const executor: LockExecutor<R, R> = {
    name: options.name ?? 'postgres',
    transactionPooler: options.transactionPooler === true,
    singleConnection: sql.options.max === 1,
    commitReportsRollback: true,
    transaction: (fn) => inTransaction(undefined, (ctx) => fn(ctx)),
    pipelinedTransaction: (opening, fn, beforeSend) => inTransaction(opening, fn, beforeSend),
    async session<T>(fn: (ctx: SessionContext<R>) => Promise<T>): Promise<T> {
      const l = await lease();
      try {
        const result = await l.reserved.unsafe(BACKEND_PID, [], l.capture);
        l.watched.pid = Number((Array.from(result) as Row[])[0]?.pid);
        // The pid postgres.js got in BackendKeyData at connect: PgBouncer invents its own.
        const backendPid = result.state?.pid ?? undefined;
        return await nested.run(() =>
          fn({
            query: l.query,
            session: l.handle,
            ...(l.interrupt && { interrupt: l.interrupt }),
            discard: l.discard,
            get signal() {
              return l.watched.fate.signal;
            },
            backendPid,
          }),
        );
      } catch (error) {
        if (isConnectionLoss(error))
          l.lostOnWire(error instanceof TaskFailure ? error.error : error);
        throw error;
      } finally {
        await finish(l);
      }
    },
  };
  return Object.freeze(executor);
}
