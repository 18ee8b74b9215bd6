// When any connection of a postgres.js pool closes, @lockkit/postgres asks the server, through the
// pool, which leased backends are gone. With every connection leased, that question waits for a
// free one. Leases whose statements also waited for the question deadlocked with it: each held
// its connection until the question was answered, and the question needed one of their
// connections. After the check's timeout (10 s) every lease of the pool was declared dead, live
// ones holding their locks included, and each lease ended so closed its connection and started the
// next check. Seen in `pnpm chaos` (postgres adapter, under load): a worker whose pool was full
// after a server restart lost every run it took, for good, while holding the job's lock for 10 s
// each time, and other workers' catch-up of the restart's ticks never finished.
//
// A lease learns of its own connection's close directly (the shield of `@lockkit/core` reports it),
// so its statements need not wait for a check about other connections.
import { createLockClient, LockKey } from '@lockkit/core';
import { testDatabaseUrl } from '@lockkit/test-db';
import pg from 'pg';
import postgres from 'postgres';
import { describe, expect, it } from 'vitest';
import { postgresExecutor } from '../src/index.js';

/** A promise and the function that resolves it. */
function gate(): { readonly opened: Promise<void>; readonly open: () => void } {
  let open!: () => void;
  const opened = new Promise<void>((resolve) => {
    open = resolve;
  });
  return { opened, open };
}

const outcome = (call: Promise<{ executed: boolean; result?: unknown }>) =>
  call.then(
    (r) => (r.executed ? `ran ${String(r.result)}` : 'skipped'),
    (error: { code?: string }) => `rejected ${error.code ?? String(error)}`,
  );

describe('a dead-backend check while every connection of the pool is leased', () => {
  for (const prepare of [true, false]) {
    it(`prepare ${prepare}: a live lease's statements go on; only the lease whose connection closed is lost`, async () => {
      const admin = new pg.Client({ connectionString: testDatabaseUrl() });
      await admin.connect();
      const closed = gate();
      // Called after lockkit's own hooks on the same option: the check has begun by then.
      const sql = postgres(testDatabaseUrl(), {
        max: 2,
        prepare,
        onnotice: () => {},
        onclose: () => closed.open(),
      });
      const locks = createLockClient(postgresExecutor(sql as never), { engineSelfTest: false });
      const key = (name: string) => LockKey.fromNames('check-saturated-pool', `${prepare}/${name}`);
      try {
        const [aIn, aGo, bIn, bGo, cIn, cGo] = [gate(), gate(), gate(), gate(), gate(), gate()];
        let bPid = 0;
        // A and B lease both connections and wait inside their locks.
        const a = outcome(
          locks.withLock(key('a'), async (_t, ctx) => {
            aIn.open();
            await aGo.opened;
            const [row] = await ctx.query('SELECT 1 AS one');
            return (row as { one: number }).one;
          }),
        );
        const b = outcome(
          locks.withLock(key('b'), async (_t, ctx) => {
            const [row] = await ctx.query('SELECT pg_backend_pid() AS pid');
            bPid = (row as { pid: number }).pid;
            bIn.open();
            await bGo.opened;
            await ctx.query('SELECT 1');
            return 'b';
          }),
        );
        await Promise.all([aIn.opened, bIn.opened]);
        // C waits in the pool's queue for a connection.
        const c = outcome(
          locks.withLock(key('c'), async () => {
            cIn.open();
            await cGo.opened;
            return 'c';
          }),
        );
        // B's backend ends: its connection closes, the watch's check begins, and the pool
        // reconnects that slot for C, the first request waiting. The check's question waits for
        // a connection behind C: every connection is leased.
        await admin.query('SELECT pg_terminate_backend($1)', [bPid]);
        await closed.opened;
        await cIn.opened;
        // A's next statement: on the connection A holds, which is alive.
        aGo.open();
        expect(await a, 'the live lease goes on').toBe('ran 1');
        bGo.open();
        expect(await b, 'the lease whose connection closed').toBe('rejected CONNECTION_LOST');
        cGo.open();
        expect(await c).toBe('ran c');
        // Nothing left behind: no session in a transaction, every lock free, and the pool serves.
        const { rows: open } = await admin.query<{ n: number }>(
          `SELECT count(*)::int AS n FROM pg_stat_activity
            WHERE datname = current_database() AND state LIKE 'idle in transaction%'
              AND pid <> pg_backend_pid()`,
        );
        expect(open[0]?.n).toBe(0);
        for (const name of ['a', 'b', 'c']) {
          const [k1, k2] = key(name).pair as readonly [number, number];
          const { rows } = await admin.query<{ got: boolean }>(
            'SELECT pg_try_advisory_lock($1::int4, $2::int4) AS got',
            [k1, k2],
          );
          expect(rows[0]?.got, `lock ${name} is free`).toBe(true);
          await admin.query('SELECT pg_advisory_unlock($1::int4, $2::int4)', [k1, k2]);
        }
        expect(await outcome(locks.withLock(key('d'), async () => 'd'))).toBe('ran d');
      } finally {
        await sql.end({ timeout: 1 });
        await admin.end();
      }
    }, 60_000);
  }
});
