// The adapter as a worker process builds it (Kysely's PostgresDialect over a pg.Pool), for the
// leases group's kill case: plain JavaScript over the built package, runnable by node.
import { Kysely, PostgresDialect } from 'kysely';
import pg from 'pg';
import { kyselyExecutor } from '../dist/index.mjs';

export function createInstance({ url, poolSize, transactionPooler = false }) {
  const pool = new pg.Pool({ connectionString: url, max: poolSize });
  pool.on('error', () => {});
  const db = new Kysely({ dialect: new PostgresDialect({ pool }) });
  return {
    executor: kyselyExecutor(db, { transactionPooler, pool }),
    close: () => db.destroy(),
  };
}
