// The adapter as a worker process builds it, for the leases group's kill case: plain JavaScript
// over the built package, runnable by node.
import knex from 'knex';
import { knexExecutor } from '../dist/index.mjs';

export function createInstance({ url, poolSize, transactionPooler = false }) {
  const db = knex({ client: 'pg', connection: url, pool: { min: 0, max: poolSize } });
  return {
    executor: knexExecutor(db, { transactionPooler }),
    close: () => db.destroy(),
  };
}
