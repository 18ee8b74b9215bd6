/**
 * `@lockkit/drizzle`: lockkit over Drizzle ORM, on any Drizzle Postgres driver.
 *
 * @example
 * ```ts
 * import { drizzle } from 'drizzle-orm/node-postgres';
 * import { createLockKit } from '@lockkit/drizzle';
 *
 * const db = drizzle(process.env.DATABASE_URL as string);
 * const locks = createLockKit(db);
 * const r = await locks.runExclusiveJob('cron_jobs', 'generate_invoices', async (tx) => {
 *   await tx.execute(sql`UPDATE invoices SET issued = true WHERE due <= now()`);
 * });
 * ```
 *
 * @packageDocumentation
 */
import { createLockClient, type LockClient, type LockClientOptions } from '@lockkit/core';
import {
  type DrizzleDatabaseLike,
  type DrizzleExecutorOptions,
  type DrizzleTransactionLike,
  drizzleExecutor,
} from './executor.js';

export {
  type DrizzleDatabaseLike,
  type DrizzleExecutorOptions,
  type DrizzleSessions,
  type DrizzleTransactionLike,
  drizzleExecutor,
  toDrizzleSql,
} from './executor.js';

/** Options of {@link createLockKit}: executor options plus the lock client's defaults. */
export type DrizzleLockKitOptions<Session = never> = DrizzleExecutorOptions<Session> &
  LockClientOptions;

/**
 * The lockkit client over a Drizzle Postgres database. Tasks receive Drizzle's `tx` inside the
 * lock's transaction: write through it and the writes commit or roll back with the lock. Exactly
 * one of the callers racing for a job runs it; the others get `{ executed: false }` at once.
 */
export function createLockKit<Tx extends DrizzleTransactionLike, Session = never>(
  db: DrizzleDatabaseLike<Tx>,
  options: DrizzleLockKitOptions<Session> = {},
): LockClient<Tx, Session> {
  const { name, transactionPooler, sessions, ...clientOptions } = options;
  return createLockClient(
    drizzleExecutor<Tx, Session>(db, {
      ...(name !== undefined && { name }),
      ...(transactionPooler !== undefined && { transactionPooler }),
      ...(sessions !== undefined && { sessions }),
    }),
    clientOptions,
  );
}
