/**
 * Kysely databases for the tests, as a user would make them: `PostgresDialect` over a `pg.Pool`,
 * the same pool given to lockkit.
 */
import { Kysely, PostgresDialect } from 'kysely';
import pg from 'pg';
import { kyselyExecutor } from '../src/index.js';

/** Kysely's own view of a database with no tables of its own: the tests write raw SQL. */
// biome-ignore lint/complexity/noBannedTypes: a database type with no tables
export type TestDatabase = {};

export function kyselyInstance(
  url: string,
  poolSize: number,
  transactionPooler = false,
  givePool = true,
) {
  const pool = new pg.Pool({ connectionString: url, max: poolSize });
  pool.on('error', () => {});
  if (!givePool) {
    // What a user who keeps the pool from lockkit must do anyway: node-postgres emits 'error' on a
    // checked-out connection whose server went away, and with no listener the process crashes.
    pool.on('connect', (client) => client.on('error', () => {}));
  }
  const db = new Kysely<TestDatabase>({ dialect: new PostgresDialect({ pool }) });
  return {
    db,
    pool,
    executor: kyselyExecutor(db, { transactionPooler, ...(givePool && { pool }) }),
    checkedOut: () => pool.totalCount - pool.idleCount,
    close: () => db.destroy(),
  };
}
