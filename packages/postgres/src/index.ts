/**
 * `@lockkit/postgres`: lockkit over postgres.js.
 *
 * @example
 * ```ts
 * import postgres from 'postgres';
 * import { createLockKit } from '@lockkit/postgres';
 *
 * const sql = postgres(process.env.DATABASE_URL as string);
 * const locks = createLockKit(sql);
 * const r = await locks.runExclusiveJob('cron_jobs', 'generate_invoices', async (tx) => {
 *   await tx`UPDATE invoices SET issued = true WHERE due <= now() AND NOT issued`;
 * });
 * ```
 *
 * @packageDocumentation
 */
import { createLockClient, type LockClient, type LockClientOptions } from '@lockkit/core';
import {
  type PostgresExecutorOptions,
  type PostgresReservedLike,
  type PostgresSqlLike,
  postgresExecutor,
} from './executor.js';

export {
  type PostgresExecutorOptions,
  type PostgresReservedLike,
  type PostgresResultLike,
  type PostgresSqlLike,
  postgresExecutor,
} from './executor.js';

/** Options of {@link createLockKit}: executor options plus the lock client's defaults. */
export type PostgresLockKitOptions = PostgresExecutorOptions & LockClientOptions;

/**
 * The lockkit client over a postgres.js `sql` instance. Tasks receive the reserved `sql` of the
 * lock's own connection, inside the lock's transaction: write through it and the writes commit
 * or roll back with the lock. Exactly one of the callers racing for a job runs it; the others get
 * `{ executed: false }` without waiting.
 */
export function createLockKit<R extends PostgresReservedLike>(
  sql: PostgresSqlLike<R>,
  options: PostgresLockKitOptions = {},
): LockClient<R, R> {
  const { name, transactionPooler, ...clientOptions } = options;
  return createLockClient(
    postgresExecutor(sql, {
      ...(name !== undefined && { name }),
      ...(transactionPooler !== undefined && { transactionPooler }),
    }),
    clientOptions,
  );
}
