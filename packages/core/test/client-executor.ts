/**
 * A minimal LockExecutor over one pg client for core's own real-Postgres tests (core cannot depend
 * on an adapter): transactions only, and, when asked, sessions on the same client.
 */
import type pg from 'pg';
import type { LockExecutor } from '../src/executor.js';

const query = (client: pg.Client) => async (text: string, params?: readonly unknown[]) =>
  (await client.query(text, params ? [...params] : undefined)).rows;

/** Transactions on `client`, one at a time (the caller never overlaps them). */
export function clientExecutor(client: pg.Client): LockExecutor<pg.Client> {
  return {
    name: 'test',
    async transaction(fn) {
      await client.query('BEGIN');
      try {
        const result = await fn({
          query: query(client),
          tx: client,
          signal: new AbortController().signal,
        });
        await client.query('COMMIT');
        return result;
      } catch (error) {
        await client.query('ROLLBACK');
        throw error;
      }
    },
  };
}

/**
 * Transactions and sessions on connections of `pool`, telling core the backend pid each
 * connection was given at connect (pg keeps it as `client.processID`), as `@lockkit/pg` does.
 */
export function poolExecutor(pool: pg.Pool): LockExecutor<pg.PoolClient, pg.PoolClient> {
  return {
    name: 'test-pool',
    async transaction(fn) {
      const client = await pool.connect();
      try {
        await client.query('BEGIN');
        const result = await fn({
          query: query(client as unknown as pg.Client),
          tx: client,
          signal: new AbortController().signal,
        });
        await client.query('COMMIT');
        return result;
      } catch (error) {
        await client.query('ROLLBACK').catch(() => {});
        throw error;
      } finally {
        client.release();
      }
    },
    async session(fn) {
      const client = await pool.connect();
      try {
        return await fn({
          query: query(client as unknown as pg.Client),
          session: client,
          signal: new AbortController().signal,
          backendPid: (client as unknown as { processID?: number }).processID,
        });
      } finally {
        client.release();
      }
    },
  };
}
