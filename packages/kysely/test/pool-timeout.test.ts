/**
 * Kysely over a pg.Pool of one whose only connection another call holds: the pool lends none within
 * its `connectionTimeoutMillis`, and lockkit's call rejects with a typed error saying it did not
 * run, not node-postgres's bare "timeout exceeded when trying to connect".
 */
import { randomBytes } from 'node:crypto';
import { isLockkitError, LockKey } from '@lockkit/core';
import { testDatabaseUrl } from '@lockkit/test-db';
import { Kysely, PostgresDialect } from 'kysely';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLockKit } from '../src/index.js';

const key = () => LockKey.fromNames('kysely-pool-timeout', randomBytes(6).toString('hex'));
const pool = new pg.Pool({
  connectionString: testDatabaseUrl(),
  max: 1,
  connectionTimeoutMillis: 300,
});
pool.on('error', () => {});
const db = new Kysely<Record<string, never>>({ dialect: new PostgresDialect({ pool }) });
const observer = new pg.Client({ connectionString: testDatabaseUrl() });
beforeAll(async () => {
  await observer.connect();
});
afterAll(async () => {
  await db.destroy();
  await observer.end();
});

describe('Kysely on a pg.Pool that lends no connection within connectionTimeoutMillis', () => {
  it.each(['withLock', 'withSessionLock'] as const)(
    '%s rejects POOL_TIMEOUT: the task did not run, and no lock was taken',
    async (call) => {
      const locks = createLockKit(db, { pool });
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
      expect((refused as Error).message).toMatch(/connectionTimeoutMillis/);
      const { rows } = await observer.query(
        `SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory'
           AND classid = $1::int8::oid AND objid = $2::int8::oid`,
        [refusedKey.pgLocks.classid, refusedKey.pgLocks.objid],
      );
      expect(rows[0].n).toBe(0);
    },
  );
});
