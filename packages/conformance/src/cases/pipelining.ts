/**
 * Round trips on the wire, counted by a TCP proxy: a run decision and a skip decision of
 * `runExclusiveJob` each cost two round trips when the adapter pipelines BEGIN with the try-lock.
 */
import { createLockClient } from '@lockkit/core';
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
}
