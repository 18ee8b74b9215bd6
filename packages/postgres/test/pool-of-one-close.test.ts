// postgres.js 3.4, a pool of one: when the only connection closes while a `sql.reserve()` waits,
// postgres.js reconnects the slot for that waiting reserve — and drops it once connected (its
// ReadyForQuery forgets a reserve it connected for, and the request has left the waiting queue
// already). A lockkit call queued behind a call whose backend was terminated then waits forever.
import { createLockClient, LockKey } from '@lockkit/core';
import { testDatabaseUrl } from '@lockkit/test-db';
import pg from 'pg';
import postgres from 'postgres';
import { describe, expect, it } from 'vitest';
import { postgresExecutor } from '../src/index.js';

describe('a pool of one whose only connection closes while a call waits for it', () => {
  for (const prepare of [true, false]) {
    it(`prepare ${prepare}: the waiting call still gets the reconnected slot`, async () => {
      const sql = postgres(testDatabaseUrl(), { max: 1, prepare, onnotice: () => {} });
      const locks = createLockClient(postgresExecutor(sql as never), {
        schema: 'lockkit_pool_one',
      });
      const admin = new pg.Client({ connectionString: testDatabaseUrl() });
      await admin.connect();
      try {
        let holderPid!: (pid: number) => void;
        const pid = new Promise<number>((resolve) => {
          holderPid = resolve;
        });
        const holder = locks.withLock(LockKey.fromNames('pool-one', 'holder'), async (_t, ctx) => {
          const [row] = await ctx.query('SELECT pg_backend_pid() AS pid');
          const lost = new Promise<void>((resolve) => {
            ctx.signal.addEventListener('abort', () => resolve());
          });
          holderPid(Number((row as { pid: number }).pid));
          await lost;
        });
        const settledHolder = holder.then(
          () => 'ran',
          (error: { code?: string }) => error.code,
        );
        await pid;
        // Queued on the pool behind the holder: the only connection is reserved.
        const waiter = locks.withLock(LockKey.fromNames('pool-one', 'waiter'), async (_t, ctx) => {
          const [row] = await ctx.query('SELECT 2 AS two');
          return (row as { two: number }).two;
        });
        await admin.query('SELECT pg_terminate_backend($1)', [await pid]);
        expect(await settledHolder).toBe('CONNECTION_LOST');
        // Liveness only: the waiter either runs or fails; before the fix it never settled.
        const outcome = await Promise.race([
          waiter.then(
            (value) => ({ ran: value }),
            (error: { code?: string }) => ({ failed: error.code }),
          ),
          new Promise((resolve) => setTimeout(() => resolve('never settled'), 10_000).unref()),
        ]);
        expect(outcome).toEqual({ ran: { executed: true, result: 2 } });
      } finally {
        await admin.end();
        await sql.end({ timeout: 1 });
      }
    }, 30_000);
  }
});
