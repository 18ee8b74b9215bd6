// postgres.js 3.4 keeps the FATAL of a backend terminated while a query ran for a ReadyForQuery
// that never comes, and hands it to the first request its slot reconnects for — a later caller
// of lockkit's, a dead-backend check, or a `sql.reserve()` that then loses the slot for good. Each
// round here terminates every backend of the pool while each runs a statement of a lockkit call
// (its task in `pg_sleep`), then asks the pool for all of its slots at once: every one must come
// back, round after round, and the next callers must run.
import { createLockClient, LockKey } from '@lockkit/core';
import { testDatabaseUrl } from '@lockkit/test-db';
import pg from 'pg';
import postgres from 'postgres';
import { describe, expect, it } from 'vitest';
import { postgresExecutor } from '../src/index.js';

const ROUNDS = 6;

/** `promise`, or `late` after `ms` (a bound on a call that would otherwise never settle). */
const bounded = <T>(promise: Promise<T>, late: T, ms: number): Promise<T> =>
  Promise.race([promise, new Promise<T>((resolve) => setTimeout(() => resolve(late), ms).unref())]);

describe('backends terminated while their statements run', () => {
  for (const poolSize of [1, 2]) {
    for (const prepare of [true, false]) {
      it(`pool of ${poolSize}, prepare ${prepare}: every slot comes back and the next callers run, ${ROUNDS} rounds`, async () => {
        const applicationName = `lockkit_stale_fatal_${poolSize}_${prepare}_${process.pid}`;
        const url = new URL(testDatabaseUrl());
        url.searchParams.set('application_name', applicationName);
        const sql = postgres(url.toString(), { max: poolSize, prepare, onnotice: () => {} });
        const locks = createLockClient(postgresExecutor(sql as never), {
          engineSelfTest: false,
        });
        const admin = new pg.Client({ connectionString: testDatabaseUrl() });
        await admin.connect();
        const sleeping = async () =>
          (
            await admin.query<{ pid: number }>(
              `SELECT pid FROM pg_stat_activity
                WHERE application_name = $1 AND state = 'active' AND query LIKE '%pg_sleep(30)%'`,
              [applicationName],
            )
          ).rows.map((r) => r.pid);
        try {
          const outcomes: string[] = [];
          for (let round = 0; round < ROUNDS; round++) {
            // One call per slot, each held in a statement on the server.
            const calls = Array.from({ length: poolSize }, (_, i) =>
              locks
                .withLock(LockKey.fromNames('stale-fatal', `${round}-${i}`), async (_t, ctx) => {
                  await ctx.query('SELECT pg_sleep(30)');
                })
                .then(
                  () => 'ran',
                  (error: { code?: string }) => error.code ?? 'error',
                ),
            );
            let pids: number[] = [];
            for (let tries = 0; tries < 500 && pids.length < poolSize; tries++) {
              pids = await sleeping();
              if (pids.length < poolSize) await new Promise((r) => setImmediate(r));
            }
            expect(pids.length, `round ${round}: every slot in pg_sleep`).toBe(poolSize);
            await admin.query('SELECT pg_terminate_backend(pid) FROM unnest($1::int4[]) AS pid', [
              pids,
            ]);
            outcomes.push((await Promise.all(calls)).join(','));
            // Every slot at once: a lost slot leaves one of these waiting for ever.
            let entered = 0;
            let open!: () => void;
            const all = new Promise<void>((resolve) => {
              open = resolve;
            });
            const next = Array.from({ length: poolSize }, (_, i) =>
              locks
                .withLock(
                  LockKey.fromNames('stale-fatal-next', `${round}-${i}`),
                  async (_t, ctx) => {
                    const [row] = await ctx.query('SELECT 1 AS one');
                    entered++;
                    if (entered === poolSize) open();
                    await all;
                    return (row as { one: number }).one;
                  },
                )
                .then(
                  (r) => (r.executed ? 'ran' : 'skipped'),
                  (error: { code?: string; message?: string }) =>
                    `${error.code ?? 'error'}: ${error.message}`,
                ),
            );
            const settled = await bounded(Promise.all(next), ['never settled'], 10_000);
            expect(settled, `round ${round}: the next callers`).toEqual(
              Array.from({ length: poolSize }, () => 'ran'),
            );
          }
          expect(outcomes).toEqual(
            Array.from({ length: ROUNDS }, () =>
              Array.from({ length: poolSize }, () => 'CONNECTION_LOST').join(','),
            ),
          );
        } finally {
          await admin.end();
          await sql.end({ timeout: 1 });
        }
      }, 120_000);
    }
  }
});
