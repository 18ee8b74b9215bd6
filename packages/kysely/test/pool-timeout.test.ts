/**
 * Kysely over a pg.Pool of one whose only connection another call holds: the pool lends none within
 * its `connectionTimeoutMillis`, and lockkit's call rejects with a typed error saying it did not
 * run, not node-postgres's bare "timeout exceeded when trying to connect".
 */
import { randomBytes } from 'node:crypto';
import { isLockkitError, LockKey } from '@lockkit/core';
import { testDatabaseUrl } from '@lockkit/test-db';
import { advisoryHolders, callOnExhaustedPool } from '@lockkit/test-db/exhausted-pool';
import { Kysely, PostgresDialect } from 'kysely';
import pg from 'pg';
import { afterAll, describe, expect, it } from 'vitest';
import { createLockKit } from '../src/index.js';

const key = () => LockKey.fromNames('kysely-pool-timeout', randomBytes(6).toString('hex'));
const pool = new pg.Pool({
  connectionString: testDatabaseUrl(),
  max: 1,
  connectionTimeoutMillis: 300,
});
pool.on('error', () => {});
const db = new Kysely<Record<string, never>>({ dialect: new PostgresDialect({ pool }) });
afterAll(async () => {
  await db.destroy();
});

describe('Kysely on a pg.Pool that lends no connection within connectionTimeoutMillis', () => {
  it.each(['withLock', 'withSessionLock'] as const)(
    '%s rejects POOL_TIMEOUT: the task did not run, and no lock was taken',
    async (call) => {
      const refusedKey = key();
      const locks = createLockKit(db, { pool });
      const seen = await callOnExhaustedPool(locks, call, key(), refusedKey);
      expect(seen.holder).toEqual({ executed: true, result: 'held' });
      expect(seen.ran).toBe(false);
      const { refused } = seen;
      expect(isLockkitError(refused) && refused.code).toBe('POOL_TIMEOUT');
      expect((refused as Error).message).toMatch(/did not run/);
      expect((refused as Error).message).toMatch(/connectionTimeoutMillis/);
      expect(await advisoryHolders(testDatabaseUrl(), refusedKey.pgLocks)).toBe(0);
    },
  );
});
