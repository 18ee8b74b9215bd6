/**
 * The Knex executor: each operation on one connection checked out of the Knex instance's own pool
 * (`knex.client.acquireConnection()`, given back with `releaseConnection`). A transaction is Knex's
 * own `knex.transaction(…, { connection })` on that connection, so the task gets a real
 * `Knex.Transaction`; lockkit's statements go to the connection itself, `$1`-parameterised.
 * Because the connection is pinned, the session capability is there too.
 *
 * @packageDocumentation
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
  ConnectionFate,
  FateTransactionContext,
  inTransactionBlock,
  inTransactionFrom,
  isConnectionLoss,
  NestedCallGuard,
  sendCancelRequest,
  slotOf,
} from '@lockkit/core/adapter';
import type { Knex } from 'knex';
import { type KnexPgConnection, type Opening, TransactionView } from './connection-view.js';
import { discardFromPool } from './pool-discard.js';

/** Options of {@link knexExecutor}. */
export interface KnexExecutorOptions {
  /** Name reported in errors; default `'knex'`. */
  readonly name?: string;
  /**
   * Declare that Knex reaches Postgres through a transaction-pooling proxy (PgBouncer in
   * transaction mode, Supavisor, RDS Proxy, pgcat): session scope is then refused before any SQL.
   */
  readonly transactionPooler?: boolean;
}

/** Runs one statement on `connection`; a lost connection is reported to `fate`. */
function queryOn(
  connection: KnexPgConnection,
  fate: ConnectionFate,
  view?: TransactionView,
): QueryFn {
  return async (text, params) => {
    if (fate.aborted) throw fate.reason;
    try {
      const result = await connection.query(text, params === undefined ? undefined : [...params]);
      view?.observe(result, false);
      const last = Array.isArray(result) ? result.at(-1) : result;
      return (last?.rows ?? []) as Row[];
    } catch (error) {
      view?.observe(undefined, true);
      if (isConnectionLoss(error)) fate.abort(error);
      throw error;
    }
  };
}

/** The protocol cancel of what `connection` runs; undefined without its BackendKeyData. */
function protocolCancel(connection: KnexPgConnection): (() => Promise<void>) | undefined {
  const { host, port, processID, secretKey } = connection;
  if (typeof host !== 'string' || typeof port !== 'number') return undefined;
  if (typeof processID !== 'number' || typeof secretKey !== 'number') return undefined;
  return () => sendCancelRequest({ host, port, pid: processID, secretKey });
}

/**
 * A {@link LockExecutor} over a Knex instance made with the `pg` client.
 *
 * Capabilities: transaction, session (a connection pinned from Knex's pool), BEGIN and the first
 * statement in one round trip, and a first statement then BEGIN in one round trip (one-round-trip
 * skips): both ride on Knex's own `BEGIN;` as one multi-statement simple query. COMMIT's answer is
 * read, so a transaction that had failed is reported, never taken for committed.
 *
 * Exactly one connection serves each operation and nothing else meanwhile; it goes back to Knex's
 * pool when the operation settles, or is discarded when it broke or was cancelled.
 *
 * @example
 * ```ts
 * import knex from 'knex';
 * import { createLockClient } from '@lockkit/core';
 * import { knexExecutor } from '@lockkit/knex';
 * const db = knex({ client: 'pg', connection: process.env.DATABASE_URL });
 * const locks = createLockClient(knexExecutor(db));
 * ```
 */
export function knexExecutor(
  knex: Knex,
  options: KnexExecutorOptions = {},
): LockExecutor<Knex.Transaction, KnexPgConnection> {
  const name = options.name ?? 'knex';
  // Knex's CockroachDB and pg-native clients call themselves 'postgresql' too; only the pg client
  // hands out node-postgres connections, and CockroachDB's advisory locks lock nothing.
  const driver = (knex.client as { driverName?: unknown } | undefined)?.driverName;
  if (driver !== 'pg') {
    throw new LockkitError(
      'OPTION_INVALID',
      `The ${name} executor needs a Knex instance made with the 'pg' client (node-postgres), not '${String(driver)}'.`,
    );
  }
  // A transaction's client hands out that transaction's own connection: lockkit's transaction
  // would nest in the caller's, and its clean-up ROLLBACK would end the caller's transaction.
  if ((knex as { isTransaction?: unknown }).isTransaction === true) {
    throw new LockkitError(
      'OPTION_INVALID',
      `The ${name} executor needs the Knex instance, not a transaction of it (a trx): lockkit opens its own transactions on connections of the instance's pool.`,
    );
  }
  const client = knex.client as Knex.Client;
  // A pool of one: a lockkit call from inside a task could never get the connection, and a wait
  // can only be cancelled with the protocol's own request.
  // Knex's own pool (`pool.max`), or an application's pg.Pool given as `connectionPool`.
  const { pool, connectionPool } = client.config as {
    pool?: { max?: unknown };
    connectionPool?: { options?: { max?: unknown } };
  };
  const poolMax = connectionPool ? connectionPool.options?.max : pool?.max;
  const alone = poolMax === 1;
  const nested = new NestedCallGuard(name, alone, client);

  const acquire = async (): Promise<KnexPgConnection> => {
    nested.check();
    return (await client.acquireConnection()) as KnexPgConnection;
  };
  /**
   * Gives the connection back. With a reason, it leaves the pool instead, closed at once (a live
   * connection would keep its session and its session locks) and without a warning in Knex's log.
   */
  const release = async (connection: KnexPgConnection, broken: unknown): Promise<void> => {
    if (broken !== undefined) return discardFromPool(client, connection, broken);
    await client.releaseConnection(connection);
  };

  async function inTransaction<T>(
    opening: Opening,
    fn: (ctx: TransactionContext<Knex.Transaction>, openingRows: Row[]) => Promise<T>,
    beforeSend?: () => void,
  ): Promise<T> {
    const connection = await acquire();
    const slot = slotOf(connection);
    const fate = new ConnectionFate();
    slot.current = fate;
    const view = new TransactionView(connection, opening);
    const query = queryOn(connection, fate, view);
    const cancel = alone ? protocolCancel(connection) : undefined;
    let broken: unknown;
    let running: Promise<T> | undefined;
    let outcome: { ok: true; value: T } | { ok: false; error: unknown } | undefined;
    try {
      // Nothing sent yet: the connection goes back idle.
      beforeSend?.();
      try {
        await knex.transaction(
          async (trx) => {
            // Knex calls this even when its BEGIN; failed (it has rejected the transaction
            // already, with that error): the task must not run outside a transaction.
            if (view.beginError !== undefined) throw view.beginError;
            const ctx = new FateTransactionContext(query, trx, fate);
            ctx.ended = view.ended;
            if (cancel) {
              ctx.interrupt = () => {
                broken ??= new Error('interrupted by lockkit');
                return cancel();
              };
            }
            running = (async () => {
              // Knex's BEGIN; went out plain (a Knex that words it differently): send it now.
              const rows =
                opening.kind === 'plain' || view.openingSent
                  ? view.openingRows
                  : await query(opening.text);
              return nested.run(() => fn(ctx, rows));
            })();
            try {
              outcome = { ok: true, value: await running };
            } catch (error) {
              outcome = { ok: false, error };
              // Knex rolls back on any rejection; the error itself is reported from `outcome`.
              throw error instanceof Error ? error : new Error('task failed');
            }
          },
          { connection: view.view },
        );
      } catch (error) {
        // Knex settles early when the task ends the transaction itself (trx.commit()): let the
        // task finish before the connection goes back.
        if (running) await running.catch(() => {});
        if (isConnectionLoss(error)) fate.abort(error);
        // No outcome: BEGIN failed. A task that returned: COMMIT failed, which core must see.
        // A task that failed: its own error is the one to report, not the ROLLBACK's.
        if (outcome === undefined || outcome.ok) throw error;
      }
      if (running) await running.catch(() => {});
      if (outcome === undefined) {
        throw new LockkitError('EXECUTOR_INVALID', `The ${name} transaction never ran its task.`);
      }
      if (!outcome.ok) throw outcome.error;
      if (view.commitAnsweredRollback) {
        throw new CommitRolledBackError(
          "COMMIT answered ROLLBACK: a statement of the task's transaction had failed (perhaps one the task caught), so nothing was written. The lock is released.",
        );
      }
      return outcome.value;
    } finally {
      if (slot.current === fate) slot.current = undefined;
      // Knex sends no ROLLBACK when its BEGIN; failed; `BEGIN; <opening>` can fail after BEGIN,
      // leaving an aborted transaction. node-postgres reports a failed statement before the
      // ReadyForQuery that gives the new status, so the status read here may be the old one.
      const status = connection.getTransactionStatus?.();
      const open =
        inTransactionBlock(status) ||
        (opening.kind === 'after-begin' && view.beginError !== undefined);
      if (!fate.aborted && broken === undefined && open) {
        await connection.query('ROLLBACK').catch((error: unknown) => {
          broken = error;
        });
      }
      await release(connection, fate.aborted ? fate.reason : broken);
    }
  }

  const executor: LockExecutor<Knex.Transaction, KnexPgConnection> = {
    name,
    transactionPooler: options.transactionPooler === true,
    singleConnection: alone,
    commitReportsRollback: true,
    transaction: (fn) => inTransaction({ kind: 'plain' }, (ctx) => fn(ctx)),
    pipelinedTransaction: (text, fn, beforeSend) =>
      inTransaction({ kind: 'after-begin', text }, fn, beforeSend),
    firstThenBegin: (text, fn, beforeSend) =>
      inTransaction({ kind: 'before-begin', text }, fn, beforeSend),
    async session<T>(fn: (ctx: SessionContext<KnexPgConnection>) => Promise<T>): Promise<T> {
      const connection = await acquire();
      const slot = slotOf(connection);
      const fate = new ConnectionFate();
      slot.current = fate;
      const cancel = alone ? protocolCancel(connection) : undefined;
      // Whatever the task did to its session, the next user of the pool must not inherit it.
      let discarded: Error | undefined;
      try {
        return await nested.run(() =>
          fn({
            query: queryOn(connection, fate),
            session: connection,
            get signal() {
              return fate.signal;
            },
            backendPid: connection.processID ?? undefined,
            ...inTransactionFrom(connection),
            ...(cancel && {
              interrupt: () => {
                discarded ??= new Error('interrupted by lockkit');
                return cancel();
              },
            }),
            discard: () => {
              discarded ??= new Error('discarded by lockkit after a session task');
            },
          }),
        );
      } finally {
        if (slot.current === fate) slot.current = undefined;
        await release(connection, fate.aborted ? fate.reason : discarded);
      }
    },
  };
  return Object.freeze(executor);
}
