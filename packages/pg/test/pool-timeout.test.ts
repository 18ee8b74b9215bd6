/**
 * A pool of one whose only connection another call holds cannot lend one within node-postgres's
 * `connectionTimeoutMillis`: lockkit's call then rejects with a typed error saying it did not run,
 * not node-postgres's bare "timeout exceeded when trying to connect".
 */
import { isLockkitError, LockKey } from '@lockkit/core';
import { testDatabaseUrl } from '@lockkit/test-db';
import pg from 'pg';
import { afterEach, describe, expect, it } from 'vitest';
import { createLockKit } from '../src/index.js';

const pools: pg.Pool[] = [];
afterEach(async () => {
  await Promise.all(pools.splice(0).map((p) => p.end()));
});

const key = () => LockKey.fromNames('pg-pool-timeout', Math.random().toString(36).slice(2));

describe('a pool that lends no connection within its connectionTimeoutMillis', () => {
  it.each(['withLock', 'withSessionLock'] as const)(
    '%s rejects POOL_TIMEOUT: the task did not run, and no lock was taken',
    async (call) => {
      const pool = new pg.Pool({
        connectionString: testDatabaseUrl(),
        max: 1,
        connectionTimeoutMillis: 300,
      });
      pool.on('error', () => {});
      pools.push(pool);
      const locks = createLockKit(pool);
      let release!: () => void;
      const gate = new Promise<void>((resolve) => {
        release = resolve;
      });
      let holding!: () => void;
      const held = new Promise<void>((resolve) => {
        holding = resolve;
      });
      // Another call holds the pool's only connection until the gate opens.
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
      expect((refused as { cause?: unknown }).cause).toBeInstanceOf(Error);
      const observer = new pg.Client({ connectionString: testDatabaseUrl() });
      await observer.connect();
      try {
        const { rows } = await observer.query(
          `SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory'
             AND classid = $1::int8::oid AND objid = $2::int8::oid`,
          [refusedKey.pgLocks.classid, refusedKey.pgLocks.objid],
        );
        expect(rows[0].n).toBe(0);
      } finally {
        await observer.end();
      }
    },
  );

  it("leaves a task's own pool timeout as it is: the task ran", async () => {
    const pool = new pg.Pool({ connectionString: testDatabaseUrl(), max: 2 });
    const other = new pg.Pool({
      connectionString: testDatabaseUrl(),
      max: 1,
      connectionTimeoutMillis: 300,
    });
    for (const p of [pool, other]) {
      p.on('error', () => {});
      pools.push(p);
    }
    const busy = await other.connect();
    try {
      const failed = await createLockKit(pool)
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
