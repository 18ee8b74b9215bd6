// The dead-backend check of @lockkit/postgres asks the server through the pool whenever any
// connection of the pool closes, and lockkit's statements on leased connections wait for it. When
// the pool cannot open a connection just then — the role's or the server's connection limit —
// postgres.js 3.4 leaves that question unanswered, and nothing may wait on it for ever: a task
// that waited would hang holding its job's lock. The lease here does not wait at all: it learns of
// its own connection's close directly (see check-saturated-pool.test.ts), so a check about another
// connection, answered or not, says nothing about it, and it runs and commits. (A check that gets
// no answer still ends the leases it could not clear, those whose close nothing else reports.)
import { randomBytes } from 'node:crypto';
import { createLockClient, LockKey } from '@lockkit/core';
import { testDatabaseUrl } from '@lockkit/test-db';
import pg from 'pg';
import postgres from 'postgres';
import { describe, expect, it } from 'vitest';
import { postgresExecutor } from '../src/index.js';

/** `promise`, or `late` after `ms`. */
const bounded = <T>(promise: Promise<T>, late: T, ms: number): Promise<T> =>
  Promise.race([promise, new Promise<T>((resolve) => setTimeout(() => resolve(late), ms).unref())]);

describe('a dead-backend check the pool cannot answer while a task holds its lock', () => {
  for (const prepare of [true, false]) {
    it(`prepare ${prepare}: the call settles, no backend is left in its transaction, and the lock is free after`, async () => {
      const admin = new pg.Client({ connectionString: testDatabaseUrl() });
      await admin.connect();
      const role = `lockkit_limited_${randomBytes(4).toString('hex')}`;
      const password = randomBytes(12).toString('hex');
      await admin.query(`CREATE ROLE ${role} LOGIN PASSWORD '${password}'`);
      const url = new URL(testDatabaseUrl());
      url.username = role;
      url.password = password;
      let closed: () => void = () => {};
      // Called after lockkit's own hooks on the same option: the check has begun by then.
      const sql = postgres(url.toString(), {
        max: 2,
        prepare,
        onnotice: () => {},
        onclose: () => closed(),
      });
      const locks = createLockClient(postgresExecutor(sql as never), { engineSelfTest: false });
      const key = LockKey.fromNames('check-failure', `${prepare}`);
      const sessionsOf = async (state: string) =>
        (
          await admin.query<{ pid: number }>(
            `SELECT pid FROM pg_stat_activity WHERE usename = $1 AND state LIKE $2`,
            [role, state],
          )
        ).rows.map((r) => r.pid);
      try {
        // Lockkit's first call learns the pool (it closes one connection it reserved): done before
        // the slots are set up.
        await locks.withLock(LockKey.fromNames('check-failure', 'warm'), async () => undefined);
        const closeSeen = new Promise<void>((resolve) => {
          closed = resolve;
        });
        // Both slots open: the second is idle in the pool.
        const first = await sql.reserve();
        const second = await sql.reserve();
        await first`SELECT 1`;
        await second`SELECT 1`;
        first.release();
        second.release();
        let entered!: () => void;
        const inside = new Promise<void>((resolve) => {
          entered = resolve;
        });
        let release!: () => void;
        const gate = new Promise<void>((resolve) => {
          release = resolve;
        });
        const call = locks
          .withLock(key, async (_t, ctx) => {
            entered();
            await gate;
            const [row] = await ctx.query('SELECT 1 AS one');
            return (row as { one: number }).one;
          })
          .then(
            (r) => (r.executed ? `ran ${String(r.result)}` : 'skipped'),
            (error: { code?: string }) => `rejected ${error.code ?? String(error)}`,
          );
        await inside;
        // No new connection for the role from now on; the two it has stay.
        await admin.query(`ALTER ROLE ${role} CONNECTION LIMIT 1`);
        const idle = await sessionsOf('idle');
        expect(idle.length, 'the idle slot').toBe(1);
        // Its close makes the watch check the leased backend through the pool, which cannot
        // reconnect the slot: the question is never answered.
        await admin.query('SELECT pg_terminate_backend($1)', [idle[0]]);
        await closeSeen;
        // The task's next statement waits for that check.
        release();
        const settled = await bounded(call, 'never settled', 30_000);
        // The check got no answer; the lease's own connection is alive, and its close would have
        // been reported to it: the task's statement ran and the call committed.
        expect(settled).toBe('ran 1');
        await admin.query(`ALTER ROLE ${role} CONNECTION LIMIT -1`);
        // No backend is left idle in its transaction holding the lock.
        let stuck: number[] = [];
        for (let tries = 0; tries < 200; tries++) {
          stuck = await sessionsOf('idle in transaction%');
          if (stuck.length === 0) break;
          await new Promise((r) => setTimeout(r, 25));
        }
        expect(stuck, 'no connection left in a transaction').toEqual([]);
        // The lock is free on the server: another session takes it at once. (Not asked through
        // this pool: after a refused connect, postgres.js may leave the next request waiting —
        // seen on the CI's PostgreSQL 15 — which is the driver's, not lockkit's.)
        const [k1, k2] = key.pair as readonly [number, number];
        const { rows: taken } = await admin.query<{ got: boolean }>(
          'SELECT pg_try_advisory_lock($1::int4, $2::int4) AS got',
          [k1, k2],
        );
        expect(taken[0]?.got, 'the lock is free after the call').toBe(true);
        await admin.query('SELECT pg_advisory_unlock($1::int4, $2::int4)', [k1, k2]);
      } finally {
        await sql.end({ timeout: 1 });
        await admin.query(
          'SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1',
          [role],
        );
        await admin.query(`DROP ROLE IF EXISTS ${role}`).catch(() => undefined);
        await admin.end();
      }
    }, 90_000);
  }
});
