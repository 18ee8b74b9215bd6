// The adapter as a worker process builds it (node-postgres under Drizzle), for the leases group's
// kill case: plain JavaScript over the built package, runnable by node.
import { drizzle } from 'drizzle-orm/node-postgres';
import pg from 'pg';
import { drizzleExecutor } from '../dist/index.mjs';

export function createInstance({ url, poolSize, transactionPooler = false }) {
  const pool = new pg.Pool({ connectionString: url, max: poolSize });
  pool.on('error', () => {});
  return {
    executor: drizzleExecutor(drizzle(pool), { transactionPooler }),
    close: () => pool.end(),
  };
}
