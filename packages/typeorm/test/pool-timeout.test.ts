/**
 * TypeORM over node-postgres with a pool of one whose only connection another call holds: the pool
 * lends none within `connectionTimeoutMillis` (TypeORM's `connectTimeoutMS`), and lockkit's call
 * rejects with a typed error saying it did not run.
 */
import { randomBytes } from 'node:crypto';
import { isLockkitError, LockKey } from '@lockkit/core';
import { testDatabaseUrl } from '@lockkit/test-db';
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
    '%s rejects POOL_TIMEOUT: the task did not run',
    async (call) => {
      const locks = createLockKit(ds);
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
      const refused = await locks[call](key(), async () => {
        ran = true;
      }).then(
        () => undefined,
        (error: unknown) => error,
      );
      release();
      expect(await holder).toEqual({ executed: true, result: 'held' });
      expect(ran).toBe(false);
      expect(isLockkitError(refused) && refused.code).toBe('POOL_TIMEOUT');
      expect((refused as Error).message).toMatch(/did not run/);
    },
  );
});
