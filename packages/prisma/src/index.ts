/**
 * `@lockkit/prisma`: lockkit over Prisma interactive transactions.
 *
 * @example
 * ```ts
 * import { createLockKit } from '@lockkit/prisma';
 * const locks = createLockKit(prisma);
 * const r = await locks.runExclusiveJob('cron_jobs', 'generate_invoices', async (tx) => {
 *   await tx.invoice.updateMany({ where: { issued: false }, data: { issued: true } });
 * });
 * ```
 *
 * @packageDocumentation
 */
import { createLockClient, type LockClient, type LockClientOptions } from '@lockkit/core';
import {
  type PrismaClientLike,
  type PrismaExecutorOptions,
  type PrismaTransactionClientLike,
  type PrismaTransactionOptions,
  prismaExecutor,
} from './executor.js';

export {
  type PrismaClientLike,
  type PrismaExecutorOptions,
  type PrismaTransactionClientLike,
  type PrismaTransactionOptions,
  prismaExecutor,
} from './executor.js';

/** Options of {@link createLockKit}: Prisma's transaction limits, executor options, client defaults. */
export type PrismaLockKitOptions = PrismaExecutorOptions & LockClientOptions;

/** The lock client of {@link createLockKit}, with per-call Prisma transaction limits. */
export interface PrismaLockKit<Tx> extends LockClient<Tx, never> {
  /**
   * The same client with other interactive-transaction limits, for one call or a group of calls:
   * `locks.withTransactionOptions({ timeout: 60_000 }).runExclusiveJob(…)`.
   */
  withTransactionOptions(options: PrismaTransactionOptions): PrismaLockKit<Tx>;
}

/**
 * The lockkit client over a `PrismaClient`. Tasks receive Prisma's transaction client `tx`: write
 * through it and the writes commit or roll back with the lock. Exactly one of the callers racing for
 * a job runs it; the others get `{ executed: false }` at once. Transaction scope only — Prisma cannot
 * pin a connection — so long jobs belong in leases (`runWithLease`), which need only short
 * transactions.
 */
export function createLockKit<Tx extends PrismaTransactionClientLike>(
  prisma: PrismaClientLike<Tx>,
  options: PrismaLockKitOptions = {},
): PrismaLockKit<Tx> {
  const { name, transactionPooler, timeout, maxWait, livenessCheckMs, ...clientOptions } = options;
  const executorOptions: PrismaExecutorOptions = {
    ...(name !== undefined && { name }),
    ...(transactionPooler !== undefined && { transactionPooler }),
    ...(timeout !== undefined && { timeout }),
    ...(maxWait !== undefined && { maxWait }),
    ...(livenessCheckMs !== undefined && { livenessCheckMs }),
  };
  const client = createLockClient(prismaExecutor(prisma, executorOptions), clientOptions);
  return Object.freeze({
    ...client,
    withTransactionOptions: (limits: PrismaTransactionOptions) =>
      createLockKit(prisma, { ...options, ...limits }),
  });
}
