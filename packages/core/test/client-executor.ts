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
