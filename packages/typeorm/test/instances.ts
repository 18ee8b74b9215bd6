/**
 * TypeORM DataSources for the tests, as a user would make them. The suite's `createInstance` is
 * synchronous while `DataSource.initialize()` is not: the instance's executor waits for the
 * initialization before handing each call to the real executor, as a user's code awaits it before
 * its first lockkit call.
 */
import type { LockExecutor, SessionContext, TransactionContext } from '@lockkit/core';
import { DataSource, type EntityManager, type QueryRunner } from 'typeorm';
import { typeormExecutor } from '../src/index.js';

/** node-postgres's pool under a DataSource: what the suite counts as checked out. */
interface PoolCounts {
  readonly totalCount: number;
  readonly idleCount: number;
}

/** A DataSource on `url` with a pool of `poolSize`, and an executor over it. */
export function typeormInstance(url: string, poolSize: number, transactionPooler = false) {
  const dataSource = new DataSource({
    type: 'postgres',
    url,
    poolSize,
    // An idle pooled connection can be cut (a terminated backend, a closed proxy): the pool
    // discards it and reports it here.
    poolErrorHandler: () => {},
  });
  const ready = dataSource.initialize();
  ready.catch(() => {});
  const real = typeormExecutor(dataSource, { transactionPooler });
  const session = real.session;
  if (session === undefined) throw new Error('the TypeORM executor has no session capability');
  const executor: LockExecutor<EntityManager, QueryRunner> = Object.freeze({
    name: real.name,
    transactionPooler: real.transactionPooler === true,
    singleConnection: real.singleConnection === true,
    async transaction<T>(fn: (ctx: TransactionContext<EntityManager>) => Promise<T>) {
      await ready;
      return real.transaction(fn);
    },
    async session<T>(fn: (ctx: SessionContext<QueryRunner>) => Promise<T>) {
      await ready;
      return session.call(real, fn) as Promise<T>;
    },
  });
  return {
    dataSource,
    executor,
    checkedOut: () => {
      const pool = (dataSource.driver as unknown as { master?: PoolCounts }).master;
      return pool ? pool.totalCount - pool.idleCount : 0;
    },
    close: async () => {
      await ready.catch(() => {});
      if (dataSource.isInitialized) await dataSource.destroy();
    },
  };
}
