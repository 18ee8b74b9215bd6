/**
 * `@lockkit/knex`: lockkit over Knex (the `pg` client).
 *
 * @example
 * ```ts
 * import knex from 'knex';
 * import { createLockKit } from '@lockkit/knex';
 *
 * const db = knex({ client: 'pg', connection: process.env.DATABASE_URL });
 * const locks = createLockKit(db);
 * const r = await locks.runExclusiveJob('cron_jobs', 'generate_invoices', async (trx) => {
 *   await trx('invoices').where('due', '<=', trx.fn.now()).update({ issued: true });
 * });
 * ```
 *
 * @packageDocumentation
 */
import { createLockClient, type LockClient, type LockClientOptions } from '@lockkit/core';
import type { Knex } from 'knex';
import type { KnexPgConnection } from './connection-view.js';
import { type KnexExecutorOptions, knexExecutor } from './executor.js';

export type { KnexPgConnection, PgQueryResultLike } from './connection-view.js';
export { type KnexExecutorOptions, knexExecutor } from './executor.js';

/** Options of {@link createLockKit}: executor options plus the lock client's defaults. */
export type KnexLockKitOptions = KnexExecutorOptions & LockClientOptions;

/**
 * The lockkit client over a Knex instance made with the `pg` client. Tasks receive Knex's `trx`
 * (a `Knex.Transaction`) inside the lock's transaction: write through it and the writes commit or
 * roll back with the lock; `trx.transaction()` inside a task is a savepoint. Session-scoped calls
 * get the node-postgres connection pinned from Knex's pool (use it with Knex's
 * `.connection(conn)`).
 *
 * Exactly one of the callers racing for a job runs it; the others get `{ executed: false }`
 * without waiting. See `LockClient` in `@lockkit/core` for every operation.
 */
export function createLockKit(
  knex: Knex,
  options: KnexLockKitOptions = {},
): LockClient<Knex.Transaction, KnexPgConnection> {
  const { name, transactionPooler, ...clientOptions } = options;
  return createLockClient(
    knexExecutor(knex, {
      ...(name !== undefined && { name }),
      ...(transactionPooler !== undefined && { transactionPooler }),
    }),
    clientOptions,
  );
}
