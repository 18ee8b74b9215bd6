// The adapter as a worker process builds it, for the leases group's kill case: plain JavaScript
// over the built package, runnable by node. The DataSource is initialized before the first call.
import { DataSource } from 'typeorm';
import { typeormExecutor } from '../dist/index.mjs';

export function createInstance({ url, poolSize, transactionPooler = false }) {
  const dataSource = new DataSource({
    type: 'postgres',
    url,
    poolSize,
    poolErrorHandler: () => {},
  });
  const ready = dataSource.initialize();
  ready.catch(() => {});
  const real = typeormExecutor(dataSource, { transactionPooler });
  return {
    executor: {
      name: real.name,
      transactionPooler,
      singleConnection: real.singleConnection,
      transaction: async (fn) => {
        await ready;
        return real.transaction(fn);
      },
      session: async (fn) => {
        await ready;
        return real.session(fn);
      },
    },
    close: async () => {
      await ready.catch(() => {});
      if (dataSource.isInitialized) await dataSource.destroy();
    },
  };
}
