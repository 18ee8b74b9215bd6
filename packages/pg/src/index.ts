/**
 * `@lockkit/pg`: lockkit over node-postgres.
 *
 * @example
 * ```ts
 * import pg from 'pg';
 * import { createLockKit } from '@lockkit/pg';
 *
 * const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL });
 * const locks = createLockKit(pool);
 * const r = await locks.runExclusiveJob('cron_jobs', 'generate_invoices', async (client) => {
 *   await client.query('UPDATE invoices SET sent = true WHERE due < now()');
 * });
 * ```
 *
 * @packageDocumentation
 */
import { createLockClient, type LockClient, type LockClientOptions } from '@lockkit/core';
import {
  type PgClientLike,
  type PgExecutorOptions,
  type PgPoolClientLike,
  type PgPoolLike,
  pgExecutor,
} from './executor.js';

export {
  type ConnectionSlot,
  guardCheckouts,
  type PgEventSourceLike,
  type PgPoolEventsLike,
  slotOf,
} from '@lockkit/core/adapter';
export {
  type PgClientLike,
  type PgExecutorOptions,
  type PgPoolClientLike,
  type PgPoolLike,
  type PgResultLike,
  pgExecutor,
} from './executor.js';

/**
 * The client a pool hands out: `pg.PoolClient` for a `pg.Pool`. Read from the promise overload of
 * `connect()`, which `pg.Pool` declares next to a callback overload.
 */
export type PgPoolClientOf<P> = P extends {
  connect: { (): Promise<infer C>; (callback: never): void };
}
  ? C
  : P extends { connect(): Promise<infer C> }
    ? C
    : PgPoolClientLike;

/** Options of {@link createLockKit}: executor options plus the lock client's defaults. */
export type PgLockKitOptions = PgExecutorOptions & LockClientOptions;

/**
 * The lockkit client over a `pg.Pool` (recommended) or one connected `pg.Client`. Tasks receive
 * the `PoolClient` (or the client) inside the lock's transaction: write through it and the writes
 * commit or roll back with the lock.
 *
 * Exactly one of the callers racing for a job runs it; the others get `{ executed: false }`
 * without waiting. See `LockClient` in `@lockkit/core` for every operation.
 */
export function createLockKit<P extends PgPoolLike>(
  pool: P,
  options?: PgLockKitOptions,
): LockClient<PgPoolClientOf<P>, PgPoolClientOf<P>>;
export function createLockKit<C extends PgClientLike>(
  client: C,
  options?: PgLockKitOptions,
): LockClient<C, C>;
export function createLockKit(
  handle: PgPoolLike | PgClientLike,
  options: PgLockKitOptions = {},
): LockClient<PgClientLike, PgClientLike> {
  const { name, transactionPooler, ...clientOptions } = options;
  return createLockClient(
    pgExecutor(handle as PgClientLike, {
      ...(name !== undefined && { name }),
      ...(transactionPooler !== undefined && { transactionPooler }),
    }),
    clientOptions,
  );
}
