// The adapter as a worker process builds it, for the leases group's kill case: plain JavaScript
// over the built package, runnable by node.
import postgres from 'postgres';
import { postgresExecutor } from '../dist/index.mjs';

export function createInstance({ url, poolSize, transactionPooler = false }) {
  const sql = postgres(url, { max: poolSize, prepare: false, onnotice: () => {} });
  return {
    executor: postgresExecutor(sql, { transactionPooler }),
    close: () => sql.end({ timeout: 5 }),
  };
}
