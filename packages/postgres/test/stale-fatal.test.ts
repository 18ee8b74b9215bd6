// postgres.js 3.4 keeps the FATAL of a backend terminated while a query ran for a ReadyForQuery
// that never comes, and hands it to the first request its slot reconnects for — a later caller
// of lockkit's, a dead-backend check, the application's own query, or a `sql.reserve()` that then
// loses the slot for good. Each round (see @lockkit/test-db's terminated-rounds) terminates every
// backend of the pool while each runs a statement of a lockkit call, then runs the application's
// queries and asks lockkit for every slot at once: all must run, round after round.
import { createLockClient, LockKey } from '@lockkit/core';
import { testDatabaseUrl } from '@lockkit/test-db';
import { expectedRound, terminatedRounds } from '@lockkit/test-db/terminated-rounds';
import postgres from 'postgres';
import { describe, expect, it } from 'vitest';
import { postgresExecutor } from '../src/index.js';

const ROUNDS = 6;

describe('backends terminated while their statements run', () => {
  for (const poolSize of [1, 2]) {
    for (const prepare of [true, false]) {
      it(`pool of ${poolSize}, prepare ${prepare}: every slot comes back and the next queries run, ${ROUNDS} rounds`, async () => {
        const applicationName = `lockkit_stale_fatal_${poolSize}_${prepare}_${process.pid}`;
        const url = new URL(testDatabaseUrl());
        url.searchParams.set('application_name', applicationName);
        const sql = postgres(url.toString(), { max: poolSize, prepare, onnotice: () => {} });
        const locks = createLockClient(postgresExecutor(sql as never), {
          engineSelfTest: false,
        });
        try {
          const rounds = await terminatedRounds({
            url: testDatabaseUrl(),
            applicationName,
            poolSize,
            rounds: ROUNDS,
            lockCall: (label, task) =>
              locks.withLock(LockKey.fromNames('stale-fatal', label), (_t, ctx) => task(ctx)),
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
});
