/**
 * Round trips on the wire, counted by a TCP proxy: a run decision and a skip decision of
 * `runExclusiveJob` each cost two round trips when the adapter pipelines BEGIN with the try-lock;
 * with `oneRoundTripSkip` on an adapter that can send a statement then BEGIN, a skip costs one and
 * leaves no transaction open.
 */
import {
  createLockClient,
  hasCapability,
  type LockClient,
  type LockClientOptions,
  type LockExecutor,
} from '@lockkit/core';
import { expect } from 'vitest';
import { type ConformanceAdapter, gate, randomKey } from '../harness.js';
import { type RoundTripProxy, startRoundTripProxy } from '../proxy.js';
import { caseIt, type Fixture } from '../suite.js';

/** One lock client on one proxied, warmed connection, and how to count a call's round trips. */
interface Counted<Tx, Session> {
  readonly executor: LockExecutor<Tx, Session>;
  readonly locks: LockClient<Tx, Session>;
  readonly counted: RoundTripProxy;
  readonly job: { readonly namespace: string; readonly jobKey: string };
  /** Round trips `call` made. */
  trips(call: () => Promise<unknown>): Promise<number>;
  /** Round trips of a decision on the job while another connection holds it, and its result. */
  skipWhileHeld(): Promise<{ trips: number; result: unknown }>;
}

async function withCountedClient<Tx, Session>(
  f: Fixture<Tx, Session>,
  options: LockClientOptions,
  body: (c: Counted<Tx, Session>) => Promise<void>,
): Promise<void> {
  const counted = await startRoundTripProxy(f.url);
  try {
    const executor = f.newInstance(1, counted.url).executor;
    const locks = createLockClient(executor, options);
    const job = randomKey().names as { namespace: string; jobKey: string };
    // Warm the single pooled connection so that connecting is not counted.
    await locks.runExclusiveJob(job.namespace, `${job.jobKey}-warm`, async () => {});
    const trips = async (call: () => Promise<unknown>) => {
      const before = counted.roundTrips();
      await call();
      return counted.roundTrips() - before;
    };
    const skipWhileHeld = async () => {
      const held = gate();
      const release = gate();
      const holder = f.locks.runExclusiveJob(job.namespace, job.jobKey, async () => {
        held.open();
        await release.promise;
      });
      await held.promise;
      let result: unknown;
      const n = await trips(async () => {
        result = await locks.runExclusiveJob(job.namespace, job.jobKey, async () => {});
      });
      release.open();
      await holder;
      return { trips: n, result };
    };
    await body({ executor, locks, counted, job, trips, skipWhileHeld });
  } finally {
    await counted.close();
  }
}

export function pipeliningCases<Tx, Session>(
  adapter: ConformanceAdapter<Tx, Session>,
  fixture: () => Fixture<Tx, Session>,
): void {
  caseIt(
    adapter,
    'pipelining.two-round-trips',
    'runExclusiveJob decides in 2 round trips, run or skip',
    () =>
      withCountedClient(fixture(), {}, async ({ locks, job, trips, skipWhileHeld }) => {
        const run = await trips(() =>
          locks.runExclusiveJob(job.namespace, job.jobKey, async () => {}),
        );
        const skip = await skipWhileHeld();
        expect(skip.result).toEqual({ executed: false });
        expect({ run, skip: skip.trips }).toEqual({ run: 2, skip: 2 });
      }),
  );

  caseIt(
    adapter,
    'pipelining.one-trip-skip',
    'with oneRoundTripSkip, a skip takes 1 round trip and leaves no transaction open; a run still takes 2 and is one transaction',
    () =>
      withCountedClient(
        fixture(),
        { oneRoundTripSkip: true },
        async ({ executor, locks, counted, job, trips, skipWhileHeld }) => {
          const capable = hasCapability(executor, 'firstThenBegin');
          // Run path: 2 round trips, and the task is inside the transaction that holds the lock.
          const run = await trips(() =>
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

          const skip = await skipWhileHeld();
          expect(skip.result).toEqual({ executed: false });
          // The server's last word to the skipping connection: idle, not inside a transaction.
          expect(counted.lastTransactionStatus()).toBe('I');
          expect({ run, skip: skip.trips }).toEqual(
            capable ? { run: 2, skip: 1 } : { run: 2, skip: 2 },
          );
          // The connection that skipped serves the next operation normally.
          expect(
            await locks.runExclusiveJob(job.namespace, job.jobKey, async () => 'again'),
          ).toEqual({ executed: true, result: 'again' });
        },
      ),
  );
}
