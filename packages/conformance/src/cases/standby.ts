/**
 * A hot standby grants advisory locks too, but only on itself: every instance that reaches a
 * replica would "win" at once. Against a real server in recovery (with lockkit's tables, as a
 * replica of a migrated primary has them), every way of taking a lock or claiming a job must
 * refuse with `NotPrimaryError`, run nothing, and leave no lock, transaction or checked-out
 * connection behind (the fixture's after-each checks, on the standby itself).
 */
import {
  createLockClient,
  createScheduler,
  hasCapability,
  type LockClient,
  NotPrimaryError,
  type SchedulerEvent,
} from '@lockkit/core';
import pg from 'pg';
import { afterAll, beforeAll, expect } from 'vitest';
import { type ConformanceAdapter, randomKey, rejection, type StandbyServer } from '../harness.js';
import { caseIt, type Fixture, useFixture } from '../suite.js';

/** The schema of a shadowing `pg_is_in_recovery()` (created on the primary before it is a standby). */
const SHADOW = 'lockkit_conformance_shadow';

/** Fails unless `error` is the refusal of a server in recovery. */
function expectRefused(error: unknown): void {
  expect(error).toBeInstanceOf(NotPrimaryError);
  expect((error as NotPrimaryError).reason).toBe('in-recovery');
}

/**
 * Declares the standby group: one standby server for the whole group, started by
 * `adapter.standby` (lockkit's tables created while it was still a primary), and a fixture whose
 * instances and observer connect to it.
 */
export function standbyCases<Tx, Session>(
  adapter: ConformanceAdapter<Tx, Session>,
  start: NonNullable<ConformanceAdapter<Tx, Session>['standby']>,
  capabilities: { readonly session: boolean },
): void {
  let server: StandbyServer | undefined;
  const standbyUrl = () => {
    if (!server) throw new Error('the standby server has not started');
    return server.url;
  };
  // Registered before the fixture's hooks: the server exists before the observer connects, and
  // stops after it has closed.
  beforeAll(async () => {
    server = await start({
      prepare: async (primaryUrl) => {
        const instance = adapter.createInstance({ url: primaryUrl, poolSize: 1 });
        try {
          await createLockClient(instance.executor).migrate();
        } finally {
          await instance.close();
        }
        // A function that says "not in recovery", for a search_path that puts it ahead of
        // pg_catalog (replicated to the standby like any object of the primary).
        const admin = new pg.Client({ connectionString: primaryUrl });
        await admin.connect();
        try {
          await admin.query(`CREATE SCHEMA IF NOT EXISTS ${SHADOW}`);
          await admin.query(
            `CREATE OR REPLACE FUNCTION ${SHADOW}.pg_is_in_recovery() RETURNS boolean LANGUAGE sql AS 'SELECT false'`,
          );
        } finally {
          await admin.end();
        }
      },
    });
  }, 120_000);
  afterAll(async () => {
    await server?.stop();
  });
  const onStandby: ConformanceAdapter<Tx, Session> = {
    ...adapter,
    databaseUrl: standbyUrl,
    observerUrl: standbyUrl,
  };
  const fixture: () => Fixture<Tx, Session> = useFixture(onStandby);

  /** Lock clients over the test's instance: plain, and with one-round-trip skips if it can. */
  const clients = (f: Fixture<Tx, Session>): LockClient<Tx, Session>[] =>
    hasCapability(f.instance.executor, 'firstThenBegin')
      ? [f.locks, createLockClient(f.instance.executor, { oneRoundTripSkip: true })]
      : [f.locks];

  caseIt(
    adapter,
    'standby.run-exclusive-job',
    'runExclusiveJob on a standby is refused with NotPrimaryError, and the task never runs',
    async () => {
      const f = fixture();
      let ran = 0;
      for (const locks of clients(f)) {
        const { namespace, jobKey } = randomKey().names as { namespace: string; jobKey: string };
        expectRefused(
          await rejection(
            locks.runExclusiveJob(namespace, jobKey, async () => {
              ran++;
            }),
          ),
        );
      }
      expect(ran).toBe(0);
    },
  );

  caseIt(
    adapter,
    'standby.recovery-check-not-shadowed',
    'a pg_is_in_recovery() of its own ahead of pg_catalog on the search_path (answering false) does not fool the check: still refused',
    async () => {
      const f = fixture();
      const url = new URL(standbyUrl());
      url.searchParams.set('options', `-c search_path=${SHADOW},pg_catalog`);
      const shadowed = createLockClient(f.newInstance(2, url.toString()).executor);
      let ran = 0;
      const { namespace, jobKey } = randomKey().names as { namespace: string; jobKey: string };
      expectRefused(
        await rejection(
          shadowed.runExclusiveJob(namespace, jobKey, async () => {
            ran++;
          }),
        ),
      );
      expectRefused(
        await rejection(
          shadowed.withLock(
            randomKey(),
            async () => {
              ran++;
            },
            { wait: true, timeoutMs: 5000 },
          ),
        ),
      );
      expect(ran).toBe(0);
    },
  );

  caseIt(
    adapter,
    'standby.with-lock',
    'withLock on a standby, try and wait, exclusive and shared: refused, the task never runs',
    async () => {
      const f = fixture();
      let ran = 0;
      for (const locks of clients(f)) {
        for (const mode of ['exclusive', 'shared'] as const) {
          for (const wait of [false, true]) {
            const error = await rejection(
              locks.withLock(
                randomKey(),
                async () => {
                  ran++;
                },
                { mode, wait, ...(wait && { timeoutMs: 5000 }) },
              ),
            );
            expectRefused(error);
          }
        }
      }
      expect(ran).toBe(0);
    },
  );

  // A transaction-only adapter has no session locks: its case is skipped, visibly, with why.
  const sessionAdapter: ConformanceAdapter<Tx, Session> = capabilities.session
    ? adapter
    : {
        ...adapter,
        disable: {
          ...adapter.disable,
          'standby.session-lock': `the ${adapter.name} executor has no session capability`,
        },
      };
  caseIt(
    sessionAdapter,
    'standby.session-lock',
    'withSessionLock on a standby, try and wait, exclusive and shared: refused, nothing held after',
    async () => {
      const f = fixture();
      let ran = 0;
      for (const mode of ['exclusive', 'shared'] as const) {
        for (const wait of [false, true]) {
          const key = randomKey();
          const error = await rejection(
            f.locks.withSessionLock(
              key,
              async () => {
                ran++;
              },
              { mode, wait, ...(wait && { timeoutMs: 5000 }) },
            ),
          );
          expectRefused(error);
          expect(await f.observer.locksOn(key)).toEqual([]);
        }
      }
      expect(ran).toBe(0);
    },
  );

  caseIt(
    adapter,
    'standby.lease',
    'runWithLease and withFencedWrite on a standby are refused with NotPrimaryError, and the task never runs',
    async () => {
      const f = fixture();
      let ran = 0;
      const { namespace, jobKey } = randomKey().names as { namespace: string; jobKey: string };
      const error = await rejection(
        f.locks.runWithLease(namespace, jobKey, async () => {
          ran++;
        }),
      );
      expect(error).toBeInstanceOf(NotPrimaryError);
      // A fenced write reaching a standby (the holder's connection moved to a replica) is refused
      // the same way, typed, and its task does not run.
      const fenced = await rejection(
        f.locks.withFencedWrite({ namespace, jobKey, token: 1n }, async () => {
          ran++;
        }),
      );
      expect(fenced).toBeInstanceOf(NotPrimaryError);
      expect(ran).toBe(0);
    },
  );

  caseIt(
    adapter,
    'standby.migrate',
    'migrate() of a schema the standby lacks is refused with NotPrimaryError before any DDL',
    async () => {
      const f = fixture();
      expectRefused(
        await rejection(
          createLockClient(f.instance.executor, { schema: 'lockkit_absent' }).migrate(),
        ),
      );
    },
  );

  caseIt(
    adapter,
    'standby.scheduler-ticks',
    'a scheduler tick on a standby, in transaction and in lease mode: a typed error event, no run',
    async () => {
      const f = fixture();
      const events: SchedulerEvent[] = [];
      let ran = 0;
      const scheduler = createScheduler(f.locks);
      scheduler.register('standby-transaction', '* * * * *', () => {
        ran++;
      });
      scheduler.register(
        'standby-lease',
        '* * * * *',
        () => {
          ran++;
        },
        { mode: 'lease' },
      );
      scheduler.on('error', (e) => events.push(e));
      scheduler.on('ran', (e) => events.push(e));
      scheduler.on('failed', (e) => events.push(e));
      const tick = new Date(Math.floor(Date.now() / 60_000) * 60_000);
      try {
        await scheduler.runTick('standby-transaction', tick);
        await scheduler.runTick('standby-lease', tick);
      } finally {
        await scheduler.stop();
      }
      expect(ran).toBe(0);
      expect(events.map((e) => [e.type, 'job' in e ? e.job : undefined])).toEqual([
        ['error', 'standby-transaction'],
        ['error', 'standby-lease'],
      ]);
      for (const e of events) expectRefused((e as { error: unknown }).error);
    },
  );
}
