/**
 * A Knex pool of one whose only connection another call holds cannot lend one within Knex's
 * `acquireConnectionTimeout`: lockkit's call then rejects with a typed error saying it did not run,
 * not Knex's bare KnexTimeoutError.
 */
import { randomBytes } from 'node:crypto';
import { isLockkitError, LockKey } from '@lockkit/core';
import { testDatabaseUrl } from '@lockkit/test-db';
import { advisoryHolders, callOnExhaustedPool } from '@lockkit/test-db/exhausted-pool';
import knex from 'knex';
import { afterAll, describe, expect, it } from 'vitest';
import { createLockKit } from '../src/index.js';

const key = () => LockKey.fromNames('knex-pool-timeout', randomBytes(6).toString('hex'));
const db = knex({
  client: 'pg',
  connection: testDatabaseUrl(),
  pool: { min: 0, max: 1 },
  acquireConnectionTimeout: 300,
  // Knex logs each refused acquire as a warning; this test reads the error, not the log.
  log: { warn: () => {}, error: () => {}, debug: () => {}, deprecate: () => {} },
});
afterAll(async () => {
  await db.destroy();
});

describe('a Knex pool that lends no connection within acquireConnectionTimeout', () => {
  it.each(['withLock', 'withSessionLock'] as const)(
    '%s rejects POOL_TIMEOUT: the task did not run, and no lock was taken',
    async (call) => {
      const refusedKey = key();
      const seen = await callOnExhaustedPool(createLockKit(db), call, key(), refusedKey);
      expect(seen.holder).toEqual({ executed: true, result: 'held' });
      expect(seen.ran).toBe(false);
      const { refused } = seen;
      expect(isLockkitError(refused) && refused.code).toBe('POOL_TIMEOUT');
      expect((refused as Error).message).toMatch(/did not run/);
      expect((refused as Error).message).toMatch(/acquireConnectionTimeout/);
      expect((refused as { cause?: { name?: unknown } }).cause?.name).toBe('KnexTimeoutError');
      expect(await advisoryHolders(testDatabaseUrl(), refusedKey.pgLocks)).toBe(0);
    },
  );
});
