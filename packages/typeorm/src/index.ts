/**
 * `@lockkit/typeorm`: lockkit over a TypeORM `DataSource` (the `postgres` driver).
 *
 * @example
 * ```ts
 * import { DataSource } from 'typeorm';
 * import { createLockKit } from '@lockkit/typeorm';
 *
 * const dataSource = await new DataSource({ type: 'postgres', url: process.env.DATABASE_URL as string }).initialize();
 * const locks = createLockKit(dataSource);
 * const r = await locks.runExclusiveJob('cron_jobs', 'generate_invoices', async (manager) => {
 *   await manager.query('UPDATE invoices SET issued = true WHERE due <= now()');
 * });
 * ```
 *
 * @packageDocumentation
 */
import { createLockClient, type LockClient, type LockClientOptions } from '@lockkit/core';
import type { DataSource, EntityManager, QueryRunner } from 'typeorm';
import { type TypeOrmExecutorOptions, typeormExecutor } from './executor.js';

export { type TypeOrmExecutorOptions, typeormExecutor } from './executor.js';

/** Options of {@link createLockKit}: executor options plus the lock client's defaults. */
export type TypeOrmLockKitOptions = TypeOrmExecutorOptions & LockClientOptions;

/**
 * The lockkit client over an initialized TypeORM `DataSource` of type `postgres`. Tasks receive
 * the `EntityManager` of the lock's transaction: write through it and the writes commit or roll
 * back with the lock. Exactly one of the callers racing for a job runs it; the others get
 * `{ executed: false }` at once. Session-scoped locks run on a `QueryRunner` pinned to one
 * connection.
 *
 * @example
 * ```ts
 * const locks = createLockKit(dataSource);
 * await locks.runExclusiveJob('billing', 'nightly', (manager) => manager.query('SELECT 1'));
 * ```
 */
export function createLockKit(
  dataSource: DataSource,
  options: TypeOrmLockKitOptions = {},
): LockClient<EntityManager, QueryRunner> {
  const { name, transactionPooler, ...clientOptions } = options;
  return createLockClient(
    typeormExecutor(dataSource, {
      ...(name !== undefined && { name }),
      ...(transactionPooler !== undefined && { transactionPooler }),
    }),
    clientOptions,
  );
}
