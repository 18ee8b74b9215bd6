/**
 * A pool of one whose only connection another call holds cannot lend one within node-postgres's
 * `connectionTimeoutMillis`: lockkit's call then rejects with a typed error saying it did not run,
 * not node-postgres's bare "timeout exceeded when trying to connect".
 */
import { isLockkitError, LockKey } from '@lockkit/core';
import { testDatabaseUrl } from '@lockkit/test-db';
import { advisoryHolders, callOnExhaustedPool } from '@lockkit/test-db/exhausted-pool';
import pg from 'pg';
import { afterEach, describe, expect, it } from 'vitest';
import { createLockKit } from '../src/index.js';

const pools: pg.Pool[] = [];
afterEach(async () => {
  await Promise.all(pools.splice(0).map((p) => p.end()));
});
function newPool(max: number, connectionTimeoutMillis?: number): pg.Pool {
  const pool = new pg.Pool({ connectionString: testDatabaseUrl(), max, connectionTimeoutMillis });
  pool.on('error', () => {});
  pools.push(pool);
  return pool;
}

const key = () => LockKey.fromNames('pg-pool-timeout', Math.random().toString(36).slice(2));

describe('a pool that lends no connection within its connectionTimeoutMillis', () => {
  it.each(['withLock', 'withSessionLock'] as const)(
    '%s rejects POOL_TIMEOUT: the task did not run, and no lock was taken',
    async (call) => {
      const refusedKey = key();
      const seen = await callOnExhaustedPool(
        createLockKit(newPool(1, 300)),
        call,
        key(),
        refusedKey,
      );
      expect(seen.holder).toEqual({ executed: true, result: 'held' });
      expect(seen.ran).toBe(false);
      const { refused } = seen;
      expect(isLockkitError(refused) && refused.code).toBe('POOL_TIMEOUT');
      expect((refused as Error).message).toMatch(/did not run/);
      expect((refused as Error).message).toMatch(/connectionTimeoutMillis/);
      expect((refused as { cause?: unknown }).cause).toBeInstanceOf(Error);
      expect(await advisoryHolders(testDatabaseUrl(), refusedKey.pgLocks)).toBe(0);
    },
  );

  it("leaves a task's own pool timeout as it is: the task ran", async () => {
    const other = newPool(1, 300);
    const busy = await other.connect();
    try {
      const failed = await createLockKit(newPool(2))
        .withLock(key(), async () => {
          const client = await other.connect();
          client.release();
        })
        .then(
          () => undefined,
          (error: unknown) => error,
        );
      expect(isLockkitError(failed)).toBe(false);
      expect((failed as Error).message).toBe('timeout exceeded when trying to connect');
    } finally {
      busy.release();
    }
  });
});
