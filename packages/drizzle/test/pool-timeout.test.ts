/**
 * Drizzle over a pg.Pool of one whose only connection another call holds: the pool lends none
 * within its `connectionTimeoutMillis`, and lockkit's call rejects with a typed error saying it did
 * not run, not node-postgres's bare "timeout exceeded when trying to connect".
 */
import { randomBytes } from 'node:crypto';
import { isLockkitError, LockKey } from '@lockkit/core';
import { testDatabaseUrl } from '@lockkit/test-db';
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
const db = drizzle(pool);
afterAll(async () => {
  await pool.end();
});

describe('Drizzle on a pg.Pool that lends no connection within connectionTimeoutMillis', () => {
  it('withLock rejects POOL_TIMEOUT: the task did not run', async () => {
    const locks = createLockKit(db);
    let release!: () => void;
    const gate = new Promise<void>((resolve) => {
      release = resolve;
    });
    let holding!: () => void;
    const held = new Promise<void>((resolve) => {
      holding = resolve;
    });
    const holder = locks.withLock(key(), async () => {
      holding();
      await gate;
      return 'held';
    });
    await held;
    let ran = false;
    const refused = await locks
      .withLock(key(), async () => {
        ran = true;
      })
      .then(
        () => undefined,
        (error: unknown) => error,
      );
    release();
    expect(await holder).toEqual({ executed: true, result: 'held' });
    expect(ran).toBe(false);
    expect(isLockkitError(refused) && refused.code).toBe('POOL_TIMEOUT');
    expect((refused as Error).message).toMatch(/did not run/);
  });
});
