/**
 * The one place that recognises a pool that lent no connection in time: the driver's pool waited
 * its acquire timeout for a free connection (every one lent elsewhere) and gave up. Nothing reached
 * the server for the call, so it did not run; lockkit says so with one typed error instead of each
 * driver's own words.
 *
 * @packageDocumentation
 */
import { LockkitError } from './errors.js';

/** A driver's refusal, and the setting that bounds the wait. */
interface PoolRefusal {
  readonly matches: (error: { readonly name?: unknown; readonly message?: unknown }) => boolean;
  readonly setting: string;
}

/**
 * The drivers' words. node-postgres's pg.Pool (also under Kysely, TypeORM, Drizzle and Prisma's
 * adapter-pg) rejects with a plain Error and no code once `connectionTimeoutMillis` passes with
 * every connection lent; Knex's pool rejects with a `KnexTimeoutError`.
 */
const REFUSALS: readonly PoolRefusal[] = [
  {
    matches: (e) => e.message === 'timeout exceeded when trying to connect',
    setting: "node-postgres's pg.Pool connectionTimeoutMillis",
  },
  {
    matches: (e) =>
      e.name === 'KnexTimeoutError' &&
      typeof e.message === 'string' &&
      /Timeout acquiring a connection/.test(e.message),
    setting: "Knex's acquireConnectionTimeout (or pool.acquireTimeoutMillis)",
  },
];

/**
 * The typed `POOL_TIMEOUT` error for `error` when it is a pool's refusal to lend a connection
 * within its acquire timeout, else undefined. Call it only for an error met before the operation
 * had its connection: a task's own query may wait on a pool too, and then the task did run.
 *
 * @example
 * ```ts
 * const typed = poolTimeoutError(error, `lock ${key}`);
 * if (typed) throw typed;
 * ```
 */
export function poolTimeoutError(error: unknown, what: string): LockkitError | undefined {
  if (!(error instanceof Error)) return undefined;
  const refusal = REFUSALS.find((r) => r.matches(error));
  if (refusal === undefined) return undefined;
  return new LockkitError(
    'POOL_TIMEOUT',
    `${what}: the pool lent no connection within its acquire timeout (${refusal.setting}), as every connection was in use: the call did not run, nothing was sent and no lock was taken. Retry later, or raise the timeout or the pool size (${error.message}).`,
    { cause: error },
  );
}
