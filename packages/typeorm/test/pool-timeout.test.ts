/**
 * TypeORM over node-postgres with a pool of one whose only connection another call holds: the pool
 * lends none within `connectionTimeoutMillis` (TypeORM's `connectTimeoutMS`), and lockkit's call
 * rejects with a typed error saying it did not run.
 */
import { randomBytes } from 'node:crypto';
import { isLockkitError, LockKey } from '@lockkit/core';
import { testDatabaseUrl } from '@lockkit/test-db';
import { advisoryHolders, callOnExhaustedPool } from '@lockkit/test-db/exhausted-pool';
import { DataSource } from 'typeorm';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLockKit } from '../src/index.js';

const key = () => LockKey.fromNames('typeorm-pool-timeout', randomBytes(6).toString('hex'));
const ds = new DataSource({
  type: 'postgres',
  url: testDatabaseUrl(),
  poolSize: 1,
  connectTimeoutMS: 300,
});
beforeAll(async () => {
  await ds.initialize();
});
afterAll(async () => {
  await ds.destroy();
});

describe('TypeORM on a pool that lends no connection within connectTimeoutMS', () => {
  it.each(['withLock', 'withSessionLock'] as const)(
    '%s rejects POOL_TIMEOUT: the task did not run, and no lock was taken',
    async (call) => {
      const refusedKey = key();
      const seen = await callOnExhaustedPool(createLockKit(ds), call, key(), refusedKey);
      expect(seen.holder).toEqual({ executed: true, result: 'held' });
      expect(seen.ran).toBe(false);
      const { refused } = seen;
      expect(isLockkitError(refused) && refused.code).toBe('POOL_TIMEOUT');
      expect((refused as Error).message).toMatch(/did not run/);
      expect(await advisoryHolders(testDatabaseUrl(), refusedKey.pgLocks)).toBe(0);
    },
  );
});
