/**
 * The TypeORM executor: each operation on its own `QueryRunner` of an initialized `DataSource`
 * (TypeORM's `postgres` driver, node-postgres under it), so one pooled connection serves the whole
 * callback and goes back to the pool when it settles.
 *
 * Transactions are opened, committed and rolled back through the QueryRunner's own methods, so
 * TypeORM knows it is inside one: a nested `manager.transaction()` in the task becomes a
 * savepoint, the DataSource's `isolationLevel` applies, and transaction subscribers fire. Core's
 * statements go straight to the node-postgres connection the QueryRunner pinned (its `connect()`
 * hands it out): TypeORM wraps driver errors and keeps only one result of a multi-statement
 * query, and core reads the driver's own errors.
 *
 * A connection goes back to the pool only outside any transaction: node-postgres's transaction
 * status is read before it goes, and one still inside a transaction (a TypeORM level the task
 * left open, a subscriber that threw after START TRANSACTION) is closed instead. A release of
 * what lockkit holds — by the task, or by `dataSource.destroy()` — closes the connection first,
 * so its transaction and locks end with it and no other caller inherits them.
 */
import {
  AfterCommitError,
  CommitRolledBackError,
  ConnectionLostError,
  isLockkitError,
  type LockExecutor,
  LockkitError,
  type QueryFn,
  type Row,
  type SessionContext,
  type TransactionContext,
} from '@lockkit/core';
import {
  ConnectionFate,
  endOnLoss,
  FateTransactionContext,
  inTransactionFrom,
  isConnectionLoss,
  NestedCallGuard,
  type PgEventSourceLike,
  retryDeadStart,
  sendCancelRequest,
  slotOf,
  TaskFailure,
} from '@lockkit/core/adapter';
import type { DataSource, EntityManager, QueryRunner } from 'typeorm';

/** Options of {@link typeormExecutor}. */
export interface TypeOrmExecutorOptions {
  /** Name reported in errors; default `'typeorm'`. */
  readonly name?: string;
  /**
   * Declare that the DataSource reaches Postgres through a transaction-pooling proxy (PgBouncer
   * in transaction mode, Supavisor, RDS Proxy, pgcat): session scope is then refused before any
   * SQL. lockkit also detects PgBouncer on its own, but declaring is certain.
   */
  readonly transactionPooler?: boolean;
}

/** The part of a node-postgres connection (what the QueryRunner pinned) this executor uses. */
interface PgConnectionLike extends PgEventSourceLike {
  readonly processID?: number | null;
  readonly secretKey?: number | null;
  readonly host?: string;
  readonly port?: number;
  getTransactionStatus?(): string | null;
  /** node-postgres's pool puts its own `release` on each client it lends. */
  release?: (error?: Error | boolean) => void;
  query(text: string, values?: unknown[]): Promise<{ rows: Row[] } | { rows: Row[] }[]>;
  end(): Promise<void>;
}

function isPgConnection(value: unknown): value is PgConnectionLike {
  const c = value as Partial<PgConnectionLike> | null;
  return (
    typeof c === 'object' &&
    c !== null &&
    typeof c.query === 'function' &&
    typeof c.on === 'function' &&
    typeof c.end === 'function'
  );
}

/** The protocol cancel of what `connection` runs; a no-op without its BackendKeyData. */
function protocolCancel(connection: PgConnectionLike): Promise<void> {
  const { processID, secretKey, host, port } = connection;
  if (typeof processID !== 'number' || typeof secretKey !== 'number') return Promise.resolve();
  if (typeof host !== 'string' || typeof port !== 'number') return Promise.resolve();
  return sendCancelRequest({ host, port, pid: processID, secretKey });
}

/**
 * Whether `connection` is inside a transaction block, as the server last reported it (`'T'` in one,
 * `'E'` in a failed one); undefined when the driver cannot tell (a node-postgres without `getTransactionStatus()`).
 */
function inTransactionBlock(connection: PgConnectionLike): boolean | undefined {
  const status = connection.getTransactionStatus?.();
  return typeof status === 'string' ? status !== 'I' : undefined;
}

/** One checked-out connection: the QueryRunner that pinned it, and what lockkit knows of it. */
interface Lease {
  readonly runner: QueryRunner;
  readonly connection: PgConnectionLike;
  readonly fate: ConnectionFate;
  readonly query: QueryFn;
  /** Gives the connection back: to the pool, or — `drop` — closed, so the pool discards it. */
  readonly done: (drop: boolean) => Promise<void>;
}

/**
 * Refuses, before any SQL, a handle that is not a DataSource: an `EntityManager` (the
 * DataSource's own `manager`, or a transaction's) or a `QueryRunner` has no `options` and no
 * `createQueryRunner`, and would fail later as a bare TypeError.
 */
function refuseOtherHandle(handle: unknown, name: string): void {
  const h = (typeof handle === 'object' && handle !== null ? handle : {}) as {
    options?: unknown;
    createQueryRunner?: unknown;
    queryRunner?: unknown;
    startTransaction?: unknown;
  };
  if (typeof h.createQueryRunner === 'function' && typeof h.options === 'object') return;
  const given =
    typeof h.startTransaction === 'function'
      ? 'a QueryRunner'
      : 'queryRunner' in h
        ? 'an EntityManager'
        : handle === null || typeof handle !== 'object'
          ? String(handle)
          : `an object of class ${(handle as object).constructor?.name ?? 'Object'}`;
  throw new LockkitError(
    'OPTION_INVALID',
    `The ${name} executor needs the TypeORM DataSource itself, but was given ${given}: pass the DataSource (manager.connection, or queryRunner.connection, is it); lockkit opens its own transactions on connections of its pool.`,
  );
}

/**
 * A {@link LockExecutor} over a TypeORM `DataSource` of type `postgres`, initialized before the
 * first lockkit call (each call checks).
 *
 * Capabilities: transaction (tasks receive the transaction's `EntityManager`) and session (a
 * `QueryRunner` pinned to one connection). No pipelining: TypeORM keeps its transaction state in
 * the QueryRunner, which only its own `startTransaction()` sets, so BEGIN travels alone.
 *
 * @example
 * ```ts
 * import { DataSource } from 'typeorm';
 * import { createLockClient } from '@lockkit/core';
 * import { typeormExecutor } from '@lockkit/typeorm';
 * const dataSource = await new DataSource({ type: 'postgres', url: process.env.DATABASE_URL as string }).initialize();
 * const locks = createLockClient(typeormExecutor(dataSource));
 * ```
 */
export function typeormExecutor(
  dataSource: DataSource,
  options: TypeOrmExecutorOptions = {},
): LockExecutor<EntityManager, QueryRunner> {
  const name = options.name ?? 'typeorm';
  refuseOtherHandle(dataSource, name);
  if (dataSource.options.type !== 'postgres') {
    throw new LockkitError(
      'OPTION_INVALID',
      `The ${name} executor needs a DataSource of type 'postgres' (node-postgres), not '${String(dataSource.options.type)}'.`,
    );
  }
  // TypeORM gives node-postgres `max: poolSize`, then `extra` over it. A pool of one: a wait can
  // only be cancelled with the protocol's own request (core otherwise cancels from another pooled
  // connection), and a lockkit call from inside a task could never get the connection.
  const { poolSize, extra } = dataSource.options as {
    poolSize?: unknown;
    extra?: { max?: unknown };
  };
  const alone = (extra?.max ?? poolSize) === 1;
  const nested = new NestedCallGuard(name, alone, dataSource);

  async function lease(): Promise<Lease> {
    nested.check();
    if (!dataSource.isInitialized) {
      throw new LockkitError(
        'OPTION_INVALID',
        `The ${name} executor's DataSource is not initialized (or was destroyed): await dataSource.initialize() first.`,
      );
    }
    const runner = dataSource.createQueryRunner('master');
    let connection: unknown;
    try {
      connection = await runner.connect();
    } catch (error) {
      await runner.release();
      throw error;
    }
    if (!isPgConnection(connection)) {
      await runner.release();
      throw new LockkitError(
        'OPTION_INVALID',
        `The ${name} executor's DataSource did not hand out a node-postgres connection.`,
      );
    }
    const pinned = connection;
    if (inTransactionBlock(pinned) === true) {
      // Someone else's transaction (a QueryRunner released without COMMIT or ROLLBACK): closing
      // the connection rolls it back, and the pool discards it.
      await pinned.end().catch(() => {});
      await runner.release();
      throw new ConnectionLostError(
        `The ${name} executor's DataSource handed out a connection still inside a transaction (a QueryRunner was released without COMMIT or ROLLBACK): lockkit closed it, which rolled that transaction back, and ran nothing. Retrying gets a fresh connection.`,
      );
    }
    // A lost connection (its backend terminated, its link cut) may not have seen its socket close
    // yet when TypeORM gives it back: the pool would keep it as live and lend it to the next
    // caller. Ended at the failure instead, whichever statement failed (TypeORM's own included).
    endOnLoss(pinned);
    const fate = new ConnectionFate();
    // lockkit's 'error'/'end' listeners stay on the connection for its life (TypeORM's own
    // 'error' listener hands a broken connection back to the pool as broken).
    const slot = slotOf(pinned);
    slot.current = fate;
    // While lockkit holds the connection, releasing it — QueryRunner.release() from the task, or
    // from dataSource.destroy(), or the pg client's own release() — would hand it to the next
    // pool user mid-transaction, holding this call's lock. It is closed instead: the
    // transaction rolls back, the locks go, and this call settles CONNECTION_LOST.
    let held = true;
    const disown = (how: string): Promise<void> => {
      if (!held) return Promise.resolve();
      held = false;
      fate.abort(
        new ConnectionLostError(
          `The connection lockkit held was released from under it (${how}): lockkit closed it, so its transaction rolled back and its locks are gone. Leave releasing to lockkit; dataSource.destroy() waits for no running call.`,
        ),
      );
      return pinned.end().catch(() => {});
    };
    const runnerRelease = runner.release.bind(runner);
    runner.release = async () => {
      await disown('QueryRunner.release(), by the task or by dataSource.destroy()');
      await runnerRelease();
    };
    const poolRelease = pinned.release;
    if (poolRelease !== undefined) {
      pinned.release = () => {
        // The pool's own release stays TypeORM's to call, once, when lockkit gives the runner back.
        void disown("the pg client's release()");
      };
    }
    const query: QueryFn = async (text, params) => {
      if (fate.aborted) throw fate.reason;
      try {
        const result = await pinned.query(text, params === undefined ? undefined : [...params]);
        return (Array.isArray(result) ? result.at(-1)?.rows : result.rows) ?? [];
      } catch (error) {
        if (isConnectionLoss(error)) fate.abort(error);
        throw error;
      }
    };
    return {
      runner,
      connection: pinned,
      fate,
      query,
      done: async (drop) => {
        if (slot.current === fate) slot.current = undefined;
        const ours = held;
        held = false;
        if (poolRelease !== undefined) pinned.release = poolRelease;
        // Never back to the pool inside a transaction: the next user's autocommit writes would
        // land in it, uncommitted, beside this call's locks.
        const dirty = inTransactionBlock(pinned) ?? runner.isTransactionActive;
        // Closed before it goes back, so the pool removes it instead of lending it again; and
        // closed in full before the caller hears back, so its session state (a lock it took on
        // the side, say) is gone by then.
        // (A lost connection was ended when its statement failed: see endOnLoss in lease().)
        if ((drop || dirty) && ours && !fate.aborted) await pinned.end().catch(() => {});
        await runnerRelease();
      },
    };
  }

  /** TypeORM's own transaction step; a dead connection turns into the reason it died. */
  async function step(l: Lease, run: () => Promise<void>): Promise<void> {
    try {
      await run();
    } catch (error) {
      if (isConnectionLoss(error)) l.fate.abort(error);
      // After a loss TypeORM has released the runner and reports only that: say why — with a
      // driver error, so that core can tell a COMMIT whose outcome is unknown (lockkit's own
      // report of a release from under it is given by the caller, before COMMIT only).
      const reason = l.fate.reason;
      throw l.fate.aborted && !isConnectionLoss(error) && !isLockkitError(reason) ? reason : error;
    }
  }

  /**
   * Ends every TypeORM transaction level still open on the lease (the task may have left some),
   * through TypeORM, so its rollback subscribers fire. False when that failed: the connection
   * must then be closed.
   */
  async function rollBackAll(l: Lease): Promise<boolean> {
    try {
      while (l.runner.isTransactionActive) await l.runner.rollbackTransaction();
      return true;
    } catch {
      return false;
    }
  }

  async function transaction<T>(
    fn: (ctx: TransactionContext<EntityManager>) => Promise<T>,
  ): Promise<T> {
    const l = await lease();
    let drop = false;
    let committing = false;
    try {
      // TypeORM has sent START TRANSACTION before its afterTransactionStart subscribers run: a
      // throw from one still leaves a transaction to roll back (below).
      await step(l, () => l.runner.startTransaction());
      const ctx = new FateTransactionContext(l.query, l.runner.manager, l.fate);
      if (alone) {
        ctx.interrupt = () => {
          // The cancel may arrive late: this connection never serves anyone else.
          drop = true;
          return protocolCancel(l.connection);
        };
      }
      const result = await nested.run(() => fn(ctx));
      committing = true;
      const active = l.runner.isTransactionActive;
      try {
        await step(l, () => l.runner.commitTransaction());
      } catch (error) {
        // TypeORM marks the transaction inactive only once COMMIT has succeeded: what failed
        // came after it (an afterTransactionCommit subscriber), and the work is committed.
        if (
          active &&
          !l.fate.aborted &&
          !l.runner.isTransactionActive &&
          inTransactionBlock(l.connection) !== true
        ) {
          throw new AfterCommitError(
            `The transaction committed (the task's writes are kept, the lock is released), then TypeORM's commit failed after COMMIT (an afterTransactionCommit subscriber threw: it is the cause). Do not run the task again for it.`,
            { cause: error },
          );
        }
        throw error;
      }
      committing = false;
      // A TypeORM level the task opened and left open (startTransaction() without its commit)
      // turns that commit into a savepoint release: nothing has committed yet.
      if (inTransactionBlock(l.connection) ?? l.runner.isTransactionActive) {
        throw new CommitRolledBackError(
          `The task left a TypeORM transaction level open (queryRunner.startTransaction() without its commitTransaction() or rollbackTransaction()), so lockkit's commit only closed that level: lockkit rolled the whole transaction back, nothing was written, and the lock is released.`,
        );
      }
      return result;
    } catch (error) {
      // Whatever says `open`: the task may have ended the transaction through TypeORM itself,
      // or left levels open; a failed rollback closes the connection (done).
      if (!l.fate.aborted && !(await rollBackAll(l))) drop = true;
      // A release from under lockkit closed the connection: before COMMIT, that is what to say,
      // also when one of core's own statements failed before the task ran (core then has no
      // connection to blame). The task's own failure (TaskFailure) core classifies itself.
      const reason = l.fate.reason;
      if (!committing && !(error instanceof TaskFailure) && isLockkitError(reason)) throw reason;
      throw error;
    } finally {
      await l.done(drop);
    }
  }

  async function session<T>(fn: (ctx: SessionContext<QueryRunner>) => Promise<T>): Promise<T> {
    const l = await lease();
    let drop = false;
    try {
      const { connection, fate } = l;
      return await nested.run(() =>
        fn({
          query: l.query,
          session: l.runner,
          get signal() {
            return fate.signal;
          },
          backendPid: connection.processID ?? undefined,
          ...inTransactionFrom(connection),
          ...(alone && {
            interrupt: () => {
              drop = true;
              return protocolCancel(connection);
            },
          }),
          // Closing one pooled connection costs the pool nothing: the next user gets a fresh one.
          discard: () => {
            drop = true;
          },
        }),
      );
    } finally {
      await l.done(drop);
    }
  }

  return Object.freeze({
    name,
    transactionPooler: options.transactionPooler === true,
    singleConnection: alone,
    // A connection whose backend was terminated a moment ago is lent as live until pg reads the
    // goodbye, and START TRANSACTION fails on it; done() closes it, so the pool discards it, and
    // the call begins again on another.
    transaction: <T>(fn: (ctx: TransactionContext<EntityManager>) => Promise<T>) =>
      retryDeadStart(transaction, fn),
    session,
  });
}
