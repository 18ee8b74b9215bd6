/**
 * `@lockkit/kysely`: lockkit over Kysely, on a Postgres dialect.
 *
 * @example
 * ```ts
 * import { Kysely, PostgresDialect, sql } from 'kysely';
 * import pg from 'pg';
 * import { createLockKit } from '@lockkit/kysely';
 *
 * const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL });
 * const db = new Kysely<Database>({ dialect: new PostgresDialect({ pool }) });
 * const locks = createLockKit(db, { pool });
 * const r = await locks.runExclusiveJob('cron_jobs', 'generate_invoices', async (trx) => {
 *   await sql`UPDATE invoices SET issued = true WHERE due <= now()`.execute(trx);
 * });
 * ```
 *
 * @packageDocumentation
 */
import { createLockClient, type LockClient, type LockClientOptions } from '@lockkit/core';
import type { Kysely, Transaction } from 'kysely';
import { type KyselyExecutorOptions, kyselyExecutor } from './executor.js';

export {
  type KyselyExecutorOptions,
  type KyselyPgClientLike,
  type KyselyPgPoolLike,
  kyselyExecutor,
} from './executor.js';

/** Options of {@link createLockKit}: executor options plus the lock client's defaults. */
export type KyselyLockKitOptions = KyselyExecutorOptions & LockClientOptions;

/**
 * The lockkit client over a `Kysely<DB>` instance. Tasks receive Kysely's `Transaction<DB>` inside
 * the lock's transaction: write through it and the writes commit or roll back with the lock.
 * Exactly one of the callers racing for a job runs it; the others get `{ executed: false }` at
 * once, without waiting. Session-scoped calls hand the task the `Kysely<DB>` pinned to the lock's
 * connection.
 *
 * @example
 * ```ts
 * const locks = createLockKit(db, { pool });
 * await locks.runExclusiveJob('reports', 'nightly', async (trx) => {
 *   await trx.insertInto('report').values({ day: new Date() }).execute();
 * });
 * ```
 */
export function createLockKit<DB>(
  db: Kysely<DB>,
  options: KyselyLockKitOptions = {},
): LockClient<Transaction<DB>, Kysely<DB>> {
  const { name, transactionPooler, pool, livenessCheckMs, ...clientOptions } = options;
  return createLockClient(
    kyselyExecutor(db, {
      ...(name !== undefined && { name }),
      ...(transactionPooler !== undefined && { transactionPooler }),
      ...(pool !== undefined && { pool }),
      ...(livenessCheckMs !== undefined && { livenessCheckMs }),
    }),
    clientOptions,
  );
}
