// The adapter as a worker process builds it (postgres.js under Drizzle), for the leases group's
// kill case: plain JavaScript over the built package, runnable by node.
import { drizzle } from 'drizzle-orm/postgres-js';
import postgres from 'postgres';
import { drizzleExecutor } from '../dist/index.mjs';

export function createInstance({ url, poolSize, transactionPooler = false }) {
  const sql = postgres(url, { max: poolSize, prepare: false, onnotice: () => {} });
  return {
    executor: drizzleExecutor(drizzle(sql), { transactionPooler }),
    close: () => sql.end({ timeout: 5 }),
  };
}
