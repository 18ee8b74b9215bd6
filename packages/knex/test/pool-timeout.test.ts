/**
 * A Knex pool of one whose only connection another call holds cannot lend one within Knex's
 * `acquireConnectionTimeout`: lockkit's call then rejects with a typed error saying it did not run,
 * not Knex's bare KnexTimeoutError.
 */
import { randomBytes } from 'node:crypto';
import { isLockkitError, LockKey } from '@lockkit/core';
import { testDatabaseUrl } from '@lockkit/test-db';
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
const observer = knex({ client: 'pg', connection: testDatabaseUrl(), pool: { min: 0, max: 1 } });
afterAll(async () => {
  await db.destroy();
  await observer.destroy();
});

describe('a Knex pool that lends no connection within acquireConnectionTimeout', () => {
  it.each(['withLock', 'withSessionLock'] as const)(
    '%s rejects POOL_TIMEOUT: the task did not run, and no lock was taken',
    async (call) => {
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
      const refusedKey = key();
      const refused = await locks[call](refusedKey, async () => {
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
      expect((refused as Error).message).toMatch(/acquireConnectionTimeout/);
      expect((refused as { cause?: { name?: unknown } }).cause?.name).toBe('KnexTimeoutError');
      const { rows } = await observer.raw(
        `SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory'
           AND classid = ?::int8::oid AND objid = ?::int8::oid`,
        [refusedKey.pgLocks.classid, refusedKey.pgLocks.objid],
      );
      expect(rows[0].n).toBe(0);
    },
  );
});
