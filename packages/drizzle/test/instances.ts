/**
 * Drizzle databases for the tests, one per driver, as a user would make them.
 */

import { pgExecutor } from '@lockkit/pg';
import { postgresExecutor } from '@lockkit/postgres';
import { drizzle as drizzlePg } from 'drizzle-orm/node-postgres';
import { drizzle as drizzlePostgres } from 'drizzle-orm/postgres-js';
import pg from 'pg';
import postgres from 'postgres';
import { drizzleExecutor } from '../src/index.js';

export function nodePostgresInstance(url: string, poolSize: number, transactionPooler = false) {
  const pool = new pg.Pool({ connectionString: url, max: poolSize });
  pool.on('error', () => {});
  const db = drizzlePg(pool);
  return {
    db,
    // Session scope, composed by the user: the pool's own executor lends the connections.
    executor: drizzleExecutor(db, { transactionPooler, sessions: pgExecutor(pool) }),
    checkedOut: () => pool.totalCount - pool.idleCount,
    close: () => pool.end(),
  };
}

export function postgresJsInstance(url: string, poolSize: number, transactionPooler = false) {
  const sql = postgres(url, { max: poolSize, prepare: !transactionPooler, onnotice: () => {} });
  const db = drizzlePostgres(sql);
  return {
    db,
    executor: drizzleExecutor(db, { transactionPooler, sessions: postgresExecutor(sql) }),
    close: () => sql.end({ timeout: 5 }),
  };
}

/** Drizzle over one connected `pg.Client` the caller also holds. */
export async function nodePostgresClientInstance(url: string) {
  const client = new pg.Client({ connectionString: url });
  client.on('error', () => {});
  await client.connect();
  return {
    executor: drizzleExecutor(drizzlePg(client)),
    query: (text: string) => client.query(text),
    close: () => client.end(),
  };
}
