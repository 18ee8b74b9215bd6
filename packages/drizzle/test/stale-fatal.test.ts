// postgres.js 3.4 keeps the FATAL of a backend terminated while a query ran, and hands it to the
// first request its slot reconnects for. Under Drizzle the terminated backend is a Drizzle
// transaction's (postgres.js `sql.begin`), which lockkit does not lease itself. Each round (see
// @lockkit/test-db's terminated-rounds) terminates every backend of the pool while each runs a
// statement of a lockkit call, then runs the application's own queries on the pool, then asks
// lockkit for every slot at once: neither may be handed the old FATAL, round after round. Before
// the shield covered Drizzle's transactions, the application's first queries after a termination
// rejected 57P01 (8 of 8 cases failed at round 0).
import { createLockClient, LockKey } from '@lockkit/core';
import { postgresExecutor } from '@lockkit/postgres';
import { testDatabaseUrl } from '@lockkit/test-db';
import { expectedRound, terminatedRounds } from '@lockkit/test-db/terminated-rounds';
import { drizzle } from 'drizzle-orm/postgres-js';
import postgres from 'postgres';
import { describe, expect, it } from 'vitest';
import { drizzleExecutor } from '../src/index.js';

const ROUNDS = 6;

describe('Drizzle on postgres.js: backends terminated while their statements run', () => {
  for (const poolSize of [1, 2]) {
    for (const prepare of [true, false]) {
      for (const sessions of [false, true]) {
        it(`pool of ${poolSize}, prepare ${prepare}, sessions ${sessions}: every slot comes back and the next queries run, ${ROUNDS} rounds`, async () => {
          const applicationName = `lockkit_dz_stale_${poolSize}_${prepare}_${sessions}_${process.pid}`;
          const url = new URL(testDatabaseUrl());
          url.searchParams.set('application_name', applicationName);
          const sql = postgres(url.toString(), { max: poolSize, prepare, onnotice: () => {} });
          const executor = drizzleExecutor(
            drizzle(sql),
            sessions ? { sessions: postgresExecutor(sql) } : {},
          );
          const locks = createLockClient(executor, { engineSelfTest: false });
          try {
            const rounds = await terminatedRounds({
              url: testDatabaseUrl(),
              applicationName,
              poolSize,
              rounds: ROUNDS,
              lockCall: (label, task) =>
                locks.withLock(LockKey.fromNames('dz-stale', label), (_t, ctx) => task(ctx)),
              appQuery: () => sql`SELECT 1 AS one`,
            });
            expect(rounds).toEqual(
              Array.from({ length: ROUNDS }, () => expectedRound(poolSize, true)),
            );
          } finally {
            await sql.end({ timeout: 1 });
          }
        }, 120_000);
      }
    }
  }
});
