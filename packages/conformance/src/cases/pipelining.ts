/**
 * Round trips on the wire, counted by a TCP proxy: a run decision and a skip decision of
 * `runExclusiveJob` each cost two round trips when the adapter pipelines BEGIN with the try-lock;
 * with `oneRoundTripSkip` on an adapter that can send a statement then BEGIN, a skip costs one and
 * leaves no transaction open.
 */
import { createLockClient, hasCapability } from '@lockkit/core';
import { expect } from 'vitest';
import { type ConformanceAdapter, gate, randomKey } from '../harness.js';
import { startRoundTripProxy } from '../proxy.js';
import { caseIt, type Fixture } from '../suite.js';

export function pipeliningCases<Tx, Session>(
  adapter: ConformanceAdapter<Tx, Session>,
  fixture: () => Fixture<Tx, Session>,
): void {
  caseIt(
    adapter,
    'pipelining.two-round-trips',
    'runExclusiveJob decides in 2 round trips, run or skip',
    async () => {
      const f = fixture();
      const counted = await startRoundTripProxy(f.url);
      try {
        const locks = createLockClient(f.newInstance(1, counted.url).executor);
        const job = randomKey().names as { namespace: string; jobKey: string };
        // Warm the single pooled connection so that connecting is not counted.
        await locks.runExclusiveJob(job.namespace, `${job.jobKey}-warm`, async () => {});

        const measure = async (run: () => Promise<unknown>) => {
          const before = counted.roundTrips();
          await run();
          return counted.roundTrips() - before;
        };
        const runTrips = await measure(() =>
          locks.runExclusiveJob(job.namespace, job.jobKey, async () => {}),
        );

        const held = gate();
        const release = gate();
        const holder = f.locks.runExclusiveJob(job.namespace, job.jobKey, async () => {
          held.open();
          await release.promise;
        });
        await held.promise;
        let skipped: unknown;
        const skipTrips = await measure(async () => {
          skipped = await locks.runExclusiveJob(job.namespace, job.jobKey, async () => {});
        });
        release.open();
        await holder;

        expect(skipped).toEqual({ executed: false });
        expect({ run: runTrips, skip: skipTrips }).toEqual({ run: 2, skip: 2 });
      } finally {
        await counted.close();
      }
    },
  );

  caseIt(
    adapter,
    'pipelining.one-trip-skip',
    'with oneRoundTripSkip, a skip takes 1 round trip and leaves no transaction open; a run still takes 2 and is one transaction',
    async () => {
      const f = fixture();
      const counted = await startRoundTripProxy(f.url);
      try {
        const executor = f.newInstance(1, counted.url).executor;
        const capable = hasCapability(executor, 'firstThenBegin');
        const locks = createLockClient(executor, { oneRoundTripSkip: true });
        const job = randomKey().names as { namespace: string; jobKey: string };
        await locks.runExclusiveJob(job.namespace, `${job.jobKey}-warm`, async () => {});
        const measure = async (run: () => Promise<unknown>) => {
          const before = counted.roundTrips();
          await run();
          return counted.roundTrips() - before;
        };

        // Run path: 2 round trips, and the task is inside the transaction that holds the lock.
        const runTrips = await measure(() =>
          locks.runExclusiveJob(job.namespace, job.jobKey, async () => {}),
        );
        const inTransaction = await locks.runExclusiveJob(
          job.namespace,
          job.jobKey,
          async (_tx, ctx) =>
            ctx.query(
              `SELECT count(*)::int AS held, now() <> statement_timestamp() AS in_tx FROM pg_locks
              WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted`,
            ),
        );
        expect(inTransaction).toEqual({ executed: true, result: [{ held: 1, in_tx: true }] });

        // Skip path, while another connection holds the job.
        const held = gate();
        const release = gate();
        const holder = f.locks.runExclusiveJob(job.namespace, job.jobKey, async () => {
          held.open();
          await release.promise;
        });
        await held.promise;
        let skipped: unknown;
        const skipTrips = await measure(async () => {
          skipped = await locks.runExclusiveJob(job.namespace, job.jobKey, async () => {});
        });
        // The server's last word to the skipping connection: idle, not inside a transaction.
        const statusAfterSkip = counted.lastTransactionStatus();
        release.open();
        await holder;

        expect(skipped).toEqual({ executed: false });
        expect(statusAfterSkip).toBe('I');
        expect({ run: runTrips, skip: skipTrips }).toEqual(
          capable ? { run: 2, skip: 1 } : { run: 2, skip: 2 },
        );
        // The connection that skipped serves the next operation normally.
        expect(await locks.runExclusiveJob(job.namespace, job.jobKey, async () => 'again')).toEqual(
          {
            executed: true,
            result: 'again',
          },
        );
      } finally {
        await counted.close();
      }
    },
  );
}
