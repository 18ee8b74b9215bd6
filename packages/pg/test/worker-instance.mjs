// The adapter as a worker process builds it, for the leases group's kill case: plain JavaScript
// over the built package, runnable by node.
import pg from 'pg';
import { pgExecutor } from '../dist/index.mjs';

export function createInstance({ url, poolSize, transactionPooler = false }) {
  const pool = new pg.Pool({ connectionString: url, max: poolSize });
  pool.on('error', () => {});
  return { executor: pgExecutor(pool, { transactionPooler }), close: () => pool.end() };
}
