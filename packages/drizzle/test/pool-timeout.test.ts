/**
 * Drizzle over a pg.Pool of one whose only connection another call holds: the pool lends none
 * within its `connectionTimeoutMillis`, and lockkit's call rejects with a typed error saying it did
 * not run, not node-postgres's bare "timeout exceeded when trying to connect".
 */
import { randomBytes } from 'node:crypto';
import { isLockkitError, LockKey } from '@lockkit/core';
import { testDatabaseUrl } from '@lockkit/test-db';
import { advisoryHolders, callOnExhaustedPool } from '@lockkit/test-db/exhausted-pool';
import { drizzle } from 'drizzle-orm/node-postgres';
import pg from 'pg';
import { afterAll, describe, expect, it } from 'vitest';
import { createLockKit } from '../src/index.js';

const key = () => LockKey.fromNames('drizzle-pool-timeout', randomBytes(6).toString('hex'));
const pool = new pg.Pool({
  connectionString: testDatabaseUrl(),
  max: 1,
  connectionTimeoutMillis: 300,
});
pool.on('error', () => {});
afterAll(async () => {
  await pool.end();
});

describe('Drizzle on a pg.Pool that lends no connection within connectionTimeoutMillis', () => {
  it('withLock rejects POOL_TIMEOUT: the task did not run, and no lock was taken', async () => {
    const refusedKey = key();
    const locks = createLockKit(drizzle(pool));
    const seen = await callOnExhaustedPool(locks, 'withLock', key(), refusedKey);
    expect(seen.holder).toEqual({ executed: true, result: 'held' });
    expect(seen.ran).toBe(false);
    const { refused } = seen;
    expect(isLockkitError(refused) && refused.code).toBe('POOL_TIMEOUT');
    expect((refused as Error).message).toMatch(/did not run/);
    expect(await advisoryHolders(testDatabaseUrl(), refusedKey.pgLocks)).toBe(0);
  });
});
