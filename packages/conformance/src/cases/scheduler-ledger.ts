/**
 * The scheduler's ledger protocol under failure, with ticks fired directly (`runTick`) on injected
 * clocks and handlers gated by promises: a runner that dies, a schedule that changes, a long
 * outage, queued ticks, timeouts, stop() mid-run, durable retries, namespaces and conflicting
 * registrations. No case waits for a real tick.
 */
import { randomBytes } from 'node:crypto';
import {
  createLockClient,
  createScheduler,
  doctor,
  isLockkitError,
  type LockClient,
  type LockExecutor,
  LockKey,
  type LockkitEvent,
  SCHEDULER_NAMESPACE,
  SCHEDULER_OUTCOMES,
  type Scheduler,
  type SchedulerEvent,
  type SchedulerOptions,
  SimulatedClock,
  sqlState,
} from '@lockkit/core';
import { expect } from 'vitest';
import { aborted, type ConformanceAdapter, gate, Observer } from '../harness.js';
import { casesOf, type Fixture, withLockkitSchema } from '../suite.js';

/** A whole minute far from now: every cron below lines up on it, and no real timer reaches it. */
const BASE = Date.UTC(2031, 0, 1, 0, 0, 0);
const at = (seconds: number) => new Date(BASE + seconds * 1000);

/**
 * Timers that never fire: a simulated clock nobody moves. A node given it beside a hand-set `now`
 * runs only the ticks the test fires — never a follow-up drain or a holder watch on real time,
 * which on a busy machine fires mid-test and runs the queue on its own, racing the test's steps.
 */
const heldTimers = (): SimulatedClock => new SimulatedClock(BASE);

/** A clock a test sets by hand. */
function handClock(seconds: number): { now: () => number; set: (seconds: number) => void } {
  let t = BASE + seconds * 1000 + 10;
  return {
    now: () => t,
    set: (s) => {
      t = BASE + s * 1000 + 10;
    },
  };
}

/** Ledger-protocol cases of the scheduler. */
export function schedulerLedgerCases<Tx, Session>(
  adapter: ConformanceAdapter<Tx, Session>,
  fixture: () => Fixture<Tx, Session>,
): void {
  const test = casesOf(adapter);

  const withSchema = (fn: (schema: string, locks: LockClient<Tx, Session>) => Promise<void>) =>
    withLockkitSchema(fixture(), fn, ['executions (job text, tick timestamptz, worker text)']);

  const rows = (schema: string, job: string) =>
    fixture().observer.query<{ tick: Date; status: string; attempt: number }>(
      `SELECT tick, status, attempt FROM "${schema}".runs WHERE job = $1 ORDER BY tick`,
      [job],
    );
  const statusOf = async (schema: string, job: string, tick: Date) =>
    (await rows(schema, job))
      .filter((r) => new Date(r.tick).getTime() === tick.getTime())
      .map((r) => r.status);
  /** Waits (up to 10 s) until the lease of job 'job' has expired in the database. */
  const leaseExpired = (schema: string) =>
    fixture().observer.until(
      async () =>
        (
          await fixture().observer.query<{ gone: boolean }>(
            `SELECT expires_at < now() AS gone FROM "${schema}".leases WHERE job_key = 'job'`,
          )
        )[0]?.gone === true,
      10_000,
    );
  /**
   * Locks the schema's lease rows `FOR KEY SHARE` from a connection of its own and keeps them
   * locked — as a fenced write's dying backend holds its row for a moment after its FATAL reached
   * the client (through PgBouncer, before the backend has exited). `release()` commits; `close()`
   * rolls back if still held, then closes the connection.
   */
  const holdLeaseRows = async (schema: string) => {
    const f = fixture();
    const holder = await Observer.connect(f.adapter.observerUrl?.() ?? f.adapter.databaseUrl());
    let held = false;
    try {
      await holder.query('BEGIN');
      await holder.query(`SELECT 1 FROM "${schema}".leases FOR KEY SHARE`);
      held = true;
    } catch (error) {
      await holder.close();
      throw error;
    }
    return {
      release: async () => {
        await holder.query('COMMIT');
        held = false;
      },
      close: async () => {
        if (held) await holder.query('ROLLBACK').catch(() => undefined);
        await holder.close();
      },
    };
  };
  /**
   * Waits (up to 10 s) until one of this test's sessions waits for an advisory lock. Only this
   * test's (its `application_name`): another suite sharing the server has waiters of its own.
   */
  const someoneWaits = () =>
    fixture().observer.until(
      async () =>
        (await fixture().observer.locksOf(fixture().applicationName)).filter((l) => !l.granted)
          .length === 1,
      10_000,
    );
  /**
   * A scheduler node on its own instance. Its namespace is the test's schema: a job's lock key does
   * not depend on the schema, and another suite running on the same server (another adapter's, in
   * CI) registers the same job names at the same moment.
   */
  const node = (
    schema: string,
    options: SchedulerOptions,
    onEvent?: (event: LockkitEvent) => void,
  ): Scheduler<Tx> =>
    createScheduler(
      createLockClient(fixture().newInstance(3).executor, {
        schema,
        ...(onEvent && { onEvent }),
      }),
      { namespace: schema, ...options },
    );

  test(
    'scheduler.runner-dies-not-skipped',
    'a tick whose runner dies while another node waits for it is run by that node, never recorded skipped',
    () =>
      withSchema(async (schema) => {
        const f = fixture();
        // Its own name: a job's lock key does not depend on the schema, and other runs of the
        // suite on this database must not hold it.
        const job = `job-${randomBytes(6).toString('hex')}`;
        const clock = handClock(0);
        const started = gate<number>();
        const release = gate();
        const judged = gate();
        const a = node(schema, { owner: 'a', now: clock.now, catchUpGraceMs: 0 });
        a.register(job, '* * * * * *', async (run) => {
          if (run.mode !== 'transaction') throw new Error('mode');
          const [me] = await run.query('SELECT pg_backend_pid() AS pid');
          started.open(Number(me?.pid));
          await release.promise;
          await run.query('SELECT 1'); // the connection is gone: this fails
        });
        // The key of the job's lock in this test's scheduler namespace (see `node`).
        const jobLock = JSON.stringify(
          LockKey.fromNames(`${SCHEDULER_NAMESPACE}/${schema}`, job).pgLocks,
        );
        let attempts = 0;
        const b = node(schema, { owner: 'b', now: clock.now, catchUpGraceMs: 0 }, (e) => {
          // B's second attempt at the job's lock: it timed out, judged A's run to be this very
          // tick's (A holds the tick's lock), and came back to wait for its outcome.
          if (
            e.type === 'lock-attempt' &&
            JSON.stringify(e.key.pgLocks) === jobLock &&
            ++attempts === 2
          )
            judged.open();
        });
        b.register(
          job,
          '* * * * * *',
          async (run) => {
            if (run.mode !== 'transaction') throw new Error('mode');
            await run.query(`INSERT INTO "${schema}".executions VALUES ('job', $1, 'b')`, [
              run.tick.toISOString(),
            ]);
          },
          // Short, so that B keeps timing out and judging while A runs: A's death may land
          // anywhere in that loop — in the wait, or in the judgement, where Postgres may have freed
          // A's tick lock a moment before its job lock. Every place must end with B running it.
          { claimTimeoutMs: 100 },
        );
        const aRun = a.runTick(job, at(0));
        const pid = await started.promise;
        const bRun = b.runTick(job, at(0));
        try {
          // No clock here: B's own events say it has judged (or, wrongly, that it is done).
          await Promise.race([judged.promise, bRun]);
          await f.observer.terminate(pid);
          // B runs the tick once Postgres has ended A's transaction; A's handler only goes on (and
          // finds its connection gone) after that, when its driver has seen the connection close.
          await bRun;
        } finally {
          release.open();
          await aRun;
          await bRun;
        }
        expect(await statusOf(schema, job, at(0))).toEqual(['SUCCEEDED']);
        const ran = await f.observer.query<{ worker: string }>(
          `SELECT worker FROM "${schema}".executions`,
        );
        expect(ran.map((r) => r.worker)).toEqual(['b']);
        await Promise.all([a.stop(), b.stop()]);
      }),
    30_000,
  );

  test(
    'scheduler.lease-runner-dies',
    'lease mode: a tick whose runner died mid-run (its lease expired under it) is run once by a surviving node, not abandoned',
    () =>
      withSchema(async (schema) => {
        const f = fixture();
        const clock = handClock(0);
        const started = gate();
        const lost = gate();
        // A process that dies: every database call it makes from now on fails.
        const base = f.newInstance(3).executor;
        let dead = false;
        const dying: LockExecutor<Tx, Session> = {
          name: base.name,
          transaction: (fn) =>
            dead ? Promise.reject(new Error('the process is dead')) : base.transaction(fn),
        };
        const a = createScheduler(createLockClient(dying, { schema }), {
          namespace: schema,
          owner: 'a',
          now: clock.now,
          catchUpGraceMs: 0,
        });
        a.register(
          'job',
          '* * * * * *',
          async (run) => {
            started.open();
            await aborted(run.signal, 20_000);
            lost.open();
          },
          { mode: 'lease', lease: { ttlMs: 1000 } },
        );
        const ran: string[] = [];
        const b = node(schema, { owner: 'b', now: clock.now, catchUpGraceMs: 0 });
        b.register(
          'job',
          '* * * * * *',
          (run) => {
            ran.push(`${(run.tick.getTime() - BASE) / 1000} attempt ${run.attempt}`);
          },
          { mode: 'lease', lease: { ttlMs: 1000 } },
        );
        const aRun = a.runTick('job', at(0));
        await started.promise;
        await b.runTick('job', at(0)); // A is alive and running it: nothing to do, nothing recorded
        expect(ran).toEqual([]);
        expect(await statusOf(schema, 'job', at(0))).toEqual(['RUNNING']);
        dead = true;
        await lost.promise; // A's renewals fail: its lease is lost at its local deadline
        await aRun;
        const expired = await leaseExpired(schema);
        expect(expired, "A's lease expired in the database").toBe(true);
        await b.runTick('job', at(0));
        await b.runTick('job', at(0)); // once only
        expect(ran).toEqual(['0 attempt 1']);
        expect(await statusOf(schema, 'job', at(0))).toEqual(['SUCCEEDED']);
        await Promise.all([a.stop(), b.stop()]);
      }),
    30_000,
  );

  test(
    'scheduler.lease-fenced-write-lost-gives-back',
    'lease mode: a handler whose fenced write lost its connection (a failover, a server restart) failed because the database went away, not by its own fault: the tick is given back and run again, never recorded FAILED and lost',
    () =>
      withSchema(async (schema) => {
        const f = fixture();
        const clock = handClock(0);
        const failed: SchedulerEvent[] = [];
        const errors: SchedulerEvent[] = [];
        const a = node(schema, { owner: 'a', now: clock.now, catchUpGraceMs: 0 });
        let calls = 0;
        a.register(
          'job',
          '* * * * * *',
          async (run) => {
            if (run.mode !== 'lease') throw new Error('mode');
            const call = ++calls;
            await run.lease.fenced(async (_tx, query) => {
              // The first attempt's connection dies under its fenced write, as in a failover.
              if (call === 1) await query('SELECT pg_terminate_backend(pg_backend_pid())');
              await query(`INSERT INTO "${schema}".executions VALUES ('job', $1, 'a')`, [
                run.tick.toISOString(),
              ]);
            });
          },
          // No timer retry within the test (a loaded machine took over 1 s between the two
          // runTicks, and the timer's run raced the second one): each run is fired by hand.
          { mode: 'lease', lease: { ttlMs: 10_000 }, retryDelayMs: 60_000 },
        );
        a.on('failed', (e) => failed.push(e));
        a.on('error', (e) => errors.push(e));
        await a.runTick('job', at(0));
        expect(calls).toBe(1);
        expect(failed, 'a connection lost under the fenced write is not the job failing').toEqual(
          [],
        );
        expect(errors.length, 'the interrupted run is reported as an error event').toBe(1);
        expect(await statusOf(schema, 'job', at(0))).toEqual(['PENDING']);
        // Given back: the next firing (here the same node; any node's drain or catch-up) runs it.
        await a.runTick('job', at(0));
        expect(calls).toBe(2);
        expect(await statusOf(schema, 'job', at(0))).toEqual(['SUCCEEDED']);
        const ran = await f.observer.query(`SELECT 1 FROM "${schema}".executions`);
        expect(ran.length).toBe(1);
        await a.stop();
      }),
    30_000,
  );

  test(
    'scheduler.lease-fenced-own-error-fails',
    'lease mode: a fenced write whose task fails by its own fault on a live connection — an error that merely looks like a lost connection (code ENOENT) — is the job failing: recorded FAILED once, never given back to run again and again',
    () =>
      withSchema(async (schema) => {
        const clock = handClock(0);
        const events: string[] = [];
        const a = node(schema, { owner: 'a', now: clock.now, catchUpGraceMs: 0 });
        let calls = 0;
        a.register(
          'job',
          '* * * * * *',
          async (run) => {
            if (run.mode !== 'lease') throw new Error('mode');
            calls++;
            await run.lease.fenced(() => {
              throw Object.assign(new Error("ENOENT: no such file, open '/etc/job.json'"), {
                code: 'ENOENT',
              });
            });
          },
          { mode: 'lease', lease: { ttlMs: 10_000 }, retryDelayMs: 60_000 },
        );
        for (const type of ['failed', 'error'] as const) a.on(type, () => events.push(type));
        await a.runTick('job', at(0));
        await a.runTick('job', at(0));
        expect(calls).toBe(1);
        expect(events).toEqual(['failed']);
        expect(await statusOf(schema, 'job', at(0))).toEqual(['FAILED']);
        await a.stop();
      }),
    30_000,
  );

  test(
    'scheduler.lease-fenced-write-lost-bounded',
    "lease mode: a tick whose fenced write loses its connection on every run is given back a bounded number of times (3 beyond the job's attempts), then recorded FAILED — not run forever",
    () =>
      withSchema(async (schema) => {
        const clock = handClock(0);
        const a = node(schema, { owner: 'a', now: clock.now, catchUpGraceMs: 0 });
        let calls = 0;
        a.register(
          'job',
          '* * * * * *',
          async (run) => {
            if (run.mode !== 'lease') throw new Error('mode');
            calls++;
            await run.lease.fenced((_tx, query) =>
              query('SELECT pg_terminate_backend(pg_backend_pid())'),
            );
          },
          // No timer retry within the test: each run is fired by hand.
          { mode: 'lease', lease: { ttlMs: 10_000 }, retries: 1, retryDelayMs: 60_000 },
        );
        const failed: SchedulerEvent[] = [];
        a.on('failed', (e) => failed.push(e));
        // Every event, for the report of a failure.
        const seen: string[] = [];
        for (const type of [...SCHEDULER_OUTCOMES, 'error'] as const)
          a.on(type, (e) =>
            seen.push(
              e.type === 'error' || e.type === 'failed'
                ? `${e.type}(${isLockkitError(e.error) ? e.error.code : e.error instanceof Error ? e.error.message : String(e.error)})`
                : e.type,
            ),
          );
        for (let i = 0; i < 8; i++) await a.runTick('job', at(0));
        // Two attempts (retries: 1) and three give-backs beyond them.
        const status = await statusOf(schema, 'job', at(0));
        expect(calls, `handler calls; events: ${seen.join(' ')}; ledger: ${status.join()}`).toBe(5);
        expect(await statusOf(schema, 'job', at(0))).toEqual(['FAILED']);
        expect(failed.map((e) => e.type === 'failed' && e.willRetry)).toEqual([false]);
        await a.stop();
      }),
    60_000,
  );

  test(
    'scheduler.lease-due-row-locked-waits',
    "lease mode: a due tick whose claim finds the lease free but its row locked for a moment (a terminated fenced write's backend still exiting, a finish in flight) waits for the row, then runs the tick — it does not leave it PENDING for the next retry timer",
    () =>
      withSchema(async (schema) => {
        const clock = handClock(0);
        const a = node(schema, { owner: 'a', now: clock.now, catchUpGraceMs: 0 });
        let calls = 0;
        const lease = { mode: 'lease' as const, lease: { ttlMs: 10_000 } };
        a.register(
          'job',
          '* * * * * *',
          () => {
            calls++;
            throw new Error('first attempt fails');
          },
          { ...lease, retries: 1, retryDelayMs: 1000 },
        );
        await a.runTick('job', at(0));
        await a.stop(); // its retry timer goes with it: only B runs the retry
        expect(await statusOf(schema, 'job', at(0))).toEqual(['PENDING']);
        clock.set(2); // the retry is due
        const leaseRows = await holdLeaseRows(schema);
        try {
          const claimed = gate();
          const b = node(schema, { owner: 'b', now: clock.now, catchUpGraceMs: 0 }, (e) => {
            // B's first claim has ended (refused: the row is locked) and released the job's lock.
            if (e.type === 'lock-released') claimed.open();
          });
          b.register(
            'job',
            '* * * * * *',
            () => {
              calls++;
            },
            { ...lease, retries: 1, retryDelayMs: 60_000, claimTimeoutMs: 20_000 },
          );
          const events: string[] = [];
          for (const type of [...SCHEDULER_OUTCOMES, 'error'] as const)
            b.on(type, (e) => events.push(e.type));
          const run = b.runTick('job', at(0));
          await Promise.race([claimed.promise, run]);
          await leaseRows.release();
          await run;
          expect(calls, `handler calls; B's events: ${events.join(' ')}`).toBe(2);
          expect(await statusOf(schema, 'job', at(0))).toEqual(['SUCCEEDED']);
          await b.stop();
        } finally {
          await leaseRows.close();
        }
      }),
    30_000,
  );

  test(
    'scheduler.lease-queue-row-locked-in-order',
    "lease mode, overlap 'queue': a fresh tick whose claim finds the lease free but its row locked is queued in the ledger at once, not kept waiting out of sight — a later tick's catch-up on another node must not record it MISSED, and the queue runs ticks in order",
    () =>
      withSchema(async (schema) => {
        const clock = handClock(0);
        const calls: number[] = [];
        const claimed = gate();
        let armed = false; // from tick 1 on: tick 0's run releases the job's lock too
        const a = node(schema, { owner: 'a', now: clock.now, catchUpGraceMs: 0 }, (e) => {
          if (armed && e.type === 'lock-released') claimed.open();
        });
        const b = node(schema, { owner: 'b', now: clock.now, catchUpGraceMs: 0 });
        for (const n of [a, b])
          n.register(
            'job',
            '* * * * * *',
            (run) => {
              calls.push((run.tick.getTime() - BASE) / 1000);
            },
            { mode: 'lease', lease: { ttlMs: 10_000 }, overlap: 'queue', claimTimeoutMs: 20_000 },
          );
        await a.runTick('job', at(0)); // the lease row exists, free
        const leaseRows = await holdLeaseRows(schema);
        try {
          clock.set(1);
          armed = true;
          const runA = a.runTick('job', at(1));
          await Promise.race([claimed.promise, runA]); // A's claim of tick 1 was refused
          // Queued where catch-up and the queue's order can see it, while the row is still locked.
          expect(await statusOf(schema, 'job', at(1))).toEqual(['PENDING']);
          await leaseRows.release();
          clock.set(2);
          await b.runTick('job', at(2));
          await runA;
        } finally {
          await leaseRows.close();
        }
        const ledger = (await rows(schema, 'job')).map(
          (r) => `${(new Date(r.tick).getTime() - BASE) / 1000}:${r.status}`,
        );
        expect(calls, `ledger: ${ledger.join(' ')}`).toEqual([0, 1, 2]);
        expect(ledger).toEqual(['0:SUCCEEDED', '1:SUCCEEDED', '2:SUCCEEDED']);
        await Promise.all([a.stop(), b.stop()]);
      }),
    30_000,
  );

  test(
    'scheduler.lease-fast-clock-waits',
    'lease mode: a node whose clock runs ahead fires the next tick while the previous tick still runs elsewhere; it waits (up to claimTimeoutMs) for that run to end and runs the tick, never recording it skipped',
    () =>
      withSchema(async (schema) => {
        const clockA = handClock(0);
        const clockB = handClock(1); // B's clock is a second ahead: tick 1 is due for it already
        const started = gate();
        const release = gate();
        const polled = gate();
        const ran: string[] = [];
        const events: string[] = [];
        const a = node(schema, { owner: 'a', now: clockA.now, catchUpGraceMs: 0 });
        a.register(
          'job',
          '* * * * * *',
          async (run) => {
            ran.push(`a ${(run.tick.getTime() - BASE) / 1000}`);
            started.open();
            await release.promise;
          },
          { mode: 'lease', lease: { ttlMs: 5000 } },
        );
        let releases = 0;
        const b = node(schema, { owner: 'b', now: clockB.now, catchUpGraceMs: 0 }, (e) => {
          // B's second look at the lease: it is waiting for A's run, not judging tick 1 at once.
          if (e.type === 'lock-released' && ++releases === 2) polled.open();
        });
        b.register(
          'job',
          '* * * * * *',
          (run) => {
            ran.push(`b ${(run.tick.getTime() - BASE) / 1000}`);
          },
          { mode: 'lease', lease: { ttlMs: 5000 }, claimTimeoutMs: 20_000 },
        );
        for (const type of ['skipped-held', 'skipped-done', 'queue-full', 'error'] as const)
          b.on(type, (e) => events.push(e.type));
        const aRun = a.runTick('job', at(0));
        await started.promise;
        const bRun = b.runTick('job', at(1));
        try {
          // Either B is waiting (the fix) or it has already judged tick 1 (the bug): no timing.
          await Promise.race([polled.promise, bRun]);
        } finally {
          release.open();
          await aRun;
          await bRun;
        }
        expect(events).toEqual([]);
        expect(ran).toEqual(['a 0', 'b 1']);
        expect(await statusOf(schema, 'job', at(1))).toEqual(['SUCCEEDED']);
        await Promise.all([a.stop(), b.stop()]);
      }),
    30_000,
  );

  test(
    'scheduler.hung-lease-handler-lets-go',
    'a lease-mode handler that ignores its signal past timeoutMs stops renewing: its lease expires and another node runs the next tick',
    () =>
      withSchema(async (schema) => {
        const clock = handClock(0);
        const started = gate();
        const a = node(schema, { owner: 'a', now: clock.now, catchUpGraceMs: 0 });
        a.register(
          'job',
          '* * * * * *',
          async () => {
            started.open();
            await new Promise(() => {}); // never settles, whatever its signal says
          },
          { mode: 'lease', timeoutMs: 300, lease: { ttlMs: 1000 } },
        );
        const ran: number[] = [];
        const b = node(schema, { owner: 'b', now: clock.now, catchUpGraceMs: 0 });
        b.register(
          'job',
          '* * * * * *',
          (run) => {
            ran.push((run.tick.getTime() - BASE) / 1000);
          },
          { mode: 'lease', timeoutMs: 300, lease: { ttlMs: 1000 } },
        );
        void a.runTick('job', at(0));
        await started.promise;
        // Released a ttlMs after the timeout, then expired a ttlMs later: well within 10 s.
        const expired = await leaseExpired(schema);
        expect(expired, "A's lease expired although its handler still runs").toBe(true);
        clock.set(1);
        await b.runTick('job', at(1));
        expect(ran).toContain(1);
        await Promise.all([a.stop({ timeoutMs: 100 }), b.stop()]);
      }),
    30_000,
  );

  test(
    'scheduler.schedule-change',
    "after the cron changes, catch-up neither records nor runs ticks of the old schedule's time",
    () =>
      withSchema(async (schema, locks) => {
        const clock = handClock(0);
        const ran: number[] = [];
        const old = createScheduler(locks, {
          namespace: schema,
          now: clock.now,
          catchUpGraceMs: 0,
        });
        old.register('job', '*/2 * * * * *', () => {});
        for (const s of [0, 2, 4]) {
          clock.set(s);
          await old.runTick('job', at(s));
        }
        const fresh = createScheduler(locks, {
          namespace: schema,
          now: clock.now,
          catchUpGraceMs: 0,
        });
        const missed: SchedulerEvent[] = [];
        fresh.on('missed', (e) => missed.push(e));
        fresh.register(
          'job',
          '*/3 * * * * *',
          (run) => {
            ran.push((run.tick.getTime() - BASE) / 1000);
          },
          { catchUp: 'latest' },
        );
        clock.set(9);
        await fresh.runTick('job', at(9));
        expect(ran).toEqual([9]);
        expect(missed).toEqual([]);
        expect((await rows(schema, 'job')).filter((r) => r.status === 'MISSED')).toEqual([]);
        // Under the new schedule catch-up still works: 12 is missed, 15 is the latest and runs.
        clock.set(18);
        await fresh.runTick('job', at(18));
        expect(ran.sort((x, y) => x - y)).toEqual([9, 15, 18]);
        expect(await statusOf(schema, 'job', at(12))).toEqual(['MISSED']);
      }),
    30_000,
  );

  /**
   * A per-second job with `catchUp: 'latest'`, run at second 0, then down until second 3,000 and
   * back for ticks 3,000 to 3,002: the ticks its handler ran, in order, marked when catch-up ran them.
   */
  const latestAfterOutage = async (
    schema: string,
    locks: LockClient<Tx, Session>,
    catchUpGraceMs: number,
  ) => {
    const clock = handClock(0);
    const ran: string[] = [];
    const s = createScheduler(locks, { namespace: schema, now: clock.now, catchUpGraceMs });
    s.register(
      'job',
      '* * * * * *',
      (run) => {
        ran.push(`${(run.tick.getTime() - BASE) / 1000}${run.catchUp ? ' catch-up' : ''}`);
      },
      { catchUp: 'latest' },
    );
    await s.runTick('job', at(0));
    for (const second of [3000, 3001, 3002]) {
      clock.set(second);
      await s.runTick('job', at(second));
    }
    return ran;
  };

  test(
    'scheduler.latest-after-outage',
    "after 3,000 s of a per-second job nobody ran, 'latest' runs the newest missed tick once, and no stale tick after",
    () =>
      withSchema(async (schema, locks) => {
        expect(await latestAfterOutage(schema, locks, 0)).toEqual([
          '0',
          '3000',
          '2999 catch-up',
          '3001',
          '3002',
        ]);
        expect(await statusOf(schema, 'job', at(2999))).toEqual(['SUCCEEDED']);
        expect(await statusOf(schema, 'job', at(2998))).toEqual(['MISSED']);
      }),
    60_000,
  );

  test(
    'scheduler.latest-once-per-outage',
    "'latest' with the default grace (2 s, longer than a per-second interval): one outage gives one catch-up run, not a second one for the tick that was inside the grace window",
    () =>
      withSchema(async (schema, locks) => {
        // Tick 2,999 is inside the grace window when tick 3,000 catches up: 2,998 is run.
        expect(await latestAfterOutage(schema, locks, 2000)).toEqual([
          '0',
          '3000',
          '2998 catch-up',
          '3001',
          '3002',
        ]);
        // Tick 3,000 ran after 2,999: the job is up to date, the hole is only recorded.
        expect(await statusOf(schema, 'job', at(2999))).toEqual(['MISSED']);
        expect(await statusOf(schema, 'job', at(2997))).toEqual(['MISSED']);
      }),
    60_000,
  );

  test(
    'scheduler.queue-in-ledger',
    "overlap 'queue', in transaction and lease mode: waiting ticks are in the ledger and hold no connection, the queue is bounded, and they run in order once",
    () =>
      withSchema(async (schema) => {
        const f = fixture();
        for (const mode of ['transaction', 'lease'] as const) {
          const job = `job-${mode}`;
          const clock = handClock(1);
          const started = gate();
          const release = gate();
          const ran: number[] = [];
          const events: SchedulerEvent[] = [];
          const instance = f.newInstance(3);
          const s = createScheduler(createLockClient(instance.executor, { schema }), {
            namespace: schema,
            now: clock.now,
            clock: heldTimers(),
            catchUpGraceMs: 0,
          });
          s.register(
            job,
            '* * * * * *',
            async (run) => {
              ran.push((run.tick.getTime() - BASE) / 1000);
              if (run.tick.getTime() === at(1).getTime()) {
                started.open();
                await release.promise;
              }
            },
            { mode, overlap: 'queue', claimTimeoutMs: 200, queueLimit: 2 },
          );
          for (const type of ['queue-full', 'missed', 'skipped-held', 'error'] as const)
            s.on(type, (e) => events.push(e));
          const first = s.runTick(job, at(1));
          await started.promise;
          const queued = [s.runTick(job, at(2)), s.runTick(job, at(3))];
          // A failed expectation must not leave the first run's transaction open under the schema.
          try {
            const inLedger = await f.observer.until(
              async () =>
                (await rows(schema, job)).filter((r) => r.status === 'PENDING').length === 2,
              3000,
            );
            expect(
              inLedger,
              `${mode}: queued ticks 2 and 3 are in the ledger while they wait`,
            ).toBe(true);
            await Promise.all(queued); // this node is done with them: they wait in the ledger
            // Only the running tick holds a connection (in lease mode, none).
            if (instance.checkedOut) expect(await instance.checkedOut()).toBeLessThanOrEqual(1);
            clock.set(4);
            await s.runTick(job, at(4)); // the queue is full
            expect(events.map((e) => e.type)).toEqual(['queue-full']);
            expect(await statusOf(schema, job, at(4))).toEqual(['SKIPPED_OVERLAP']);
          } finally {
            release.open();
            await first;
            await Promise.all(queued);
            await s.stop();
          }
          expect(ran, mode).toEqual([1, 2, 3]);
          for (const t of [1, 2, 3])
            expect(await statusOf(schema, job, at(t))).toEqual(['SUCCEEDED']);
        }
      }),
    30_000,
  );

  test(
    'scheduler.latest-catch-up-held',
    "'latest', in transaction and lease mode: the hole catch-up chose is held for it in the ledger, so the next tick, judging while the first still runs, neither records it missed nor runs it again: one catch-up run",
    () =>
      withSchema(async (schema) => {
        for (const mode of ['transaction', 'lease'] as const) {
          const job = `job-${mode}`;
          const ran: string[] = [];
          const started = gate();
          const release = gate();
          const handler = async (run: { readonly tick: Date; readonly catchUp: boolean }) => {
            const second = (run.tick.getTime() - BASE) / 1000;
            ran.push(`${second}${run.catchUp ? ' catch-up' : ''}`);
            if (second === 10) {
              started.open();
              await release.promise;
            }
          };
          // Transaction mode: B waits for the job's lock. Lease mode: B judges tick 11 at once
          // (and catch-up judges ticks up to a claimTimeoutMs old).
          const claimTimeoutMs = mode === 'lease' ? 1 : 20_000;
          const options = { mode, catchUp: 'latest', claimTimeoutMs } as const;
          const clockA = handClock(0);
          const a = node(schema, { owner: 'a', now: clockA.now, catchUpGraceMs: 0 });
          a.register(job, '* * * * * *', handler, options);
          const b = node(schema, { owner: 'b', now: handClock(11).now, catchUpGraceMs: 0 });
          b.register(job, '* * * * * *', handler, options);
          await a.runTick(job, at(0));
          clockA.set(10); // back after an outage: catch-up picks 9 and A runs 10 first
          const aRun = a.runTick(job, at(10));
          await started.promise;
          let bRun: Promise<void> | undefined;
          try {
            bRun = b.runTick(job, at(11));
            // Transaction mode: B waits for the job's lock, and judges once A's run of 10 commits.
            if (mode === 'transaction') expect(await someoneWaits(), mode).toBe(true);
            else await bRun;
          } finally {
            release.open();
            await aRun;
            await bRun;
          }
          await Promise.all([a.stop(), b.stop()]);
          expect(
            ran.filter((r) => r.endsWith('catch-up')),
            mode,
          ).toEqual(['9 catch-up']);
          expect(await statusOf(schema, job, at(9)), mode).toEqual(['SUCCEEDED']);
        }
      }),
    30_000,
  );

  test(
    'scheduler.lease-waiting-tick-not-judged',
    'lease mode: catch-up leaves alone the ticks a node may still be waiting to run (newer than claimTimeoutMs plus the grace); a later tick judges them',
    () =>
      withSchema(async (schema, locks) => {
        const clock = handClock(0);
        const s = createScheduler(locks, { namespace: schema, now: clock.now, catchUpGraceMs: 0 });
        s.register('job', '* * * * * *', () => {}, { mode: 'lease', claimTimeoutMs: 5000 });
        await s.runTick('job', at(0));
        clock.set(3);
        await s.runTick('job', at(3)); // ticks 1 and 2 may still be waiting on other nodes
        expect(await statusOf(schema, 'job', at(1))).toEqual([]);
        expect(await statusOf(schema, 'job', at(2))).toEqual([]);
        clock.set(9);
        await s.runTick('job', at(9));
        expect(await statusOf(schema, 'job', at(1))).toEqual(['MISSED']);
        expect(await statusOf(schema, 'job', at(2))).toEqual(['MISSED']);
        expect(await statusOf(schema, 'job', at(4))).toEqual(['MISSED']);
        expect(await statusOf(schema, 'job', at(5))).toEqual([]); // still within 5 s of tick 9
      }),
    30_000,
  );

  test(
    'scheduler.catch-up-not-a-queue',
    "overlap 'queue' with catch-up, in transaction and lease mode: the ticks catch-up holds for itself neither fill the queue nor make the fresh tick wait behind them: it runs, then they do",
    () =>
      withSchema(async (schema, locks) => {
        for (const mode of ['transaction', 'lease'] as const) {
          const job = `job-${mode}`;
          const clock = handClock(0);
          const ran: string[] = [];
          const s = createScheduler(locks, {
            namespace: schema,
            now: clock.now,
            catchUpGraceMs: 0,
          });
          s.register(
            job,
            '* * * * * *',
            (run) => {
              ran.push(`${(run.tick.getTime() - BASE) / 1000}${run.catchUp ? ' catch-up' : ''}`);
            },
            {
              mode,
              overlap: 'queue',
              queueLimit: 1,
              catchUp: { withinMs: 3000 },
              claimTimeoutMs: 1,
            },
          );
          await s.runTick(job, at(0));
          clock.set(10);
          await s.runTick(job, at(10)); // holes 1–9: 7, 8 and 9 are caught up, 1–6 missed
          await s.stop();
          expect(ran, mode).toEqual(['0', '10', '7 catch-up', '8 catch-up', '9 catch-up']);
          expect(await statusOf(schema, job, at(10)), mode).toEqual(['SUCCEEDED']);
        }
      }),
    30_000,
  );

  test(
    'scheduler.lease-jittered-tick-not-judged',
    'lease mode: a tick fired up to jitterMs late may still be waiting for the lease claimTimeoutMs after that: catch-up leaves it alone that long',
    () =>
      withSchema(async (schema, locks) => {
        const clock = handClock(0);
        const s = createScheduler(locks, { namespace: schema, now: clock.now, catchUpGraceMs: 0 });
        s.register('job', '*/10 * * * * *', () => {}, {
          mode: 'lease',
          claimTimeoutMs: 8000,
          jitterMs: 4000,
        });
        await s.runTick('job', at(0));
        clock.set(20);
        // Tick 10 may have fired at 14 and wait for a lease until 22: not judged yet.
        await s.runTick('job', at(20));
        expect(await statusOf(schema, 'job', at(10))).toEqual([]);
        clock.set(30);
        await s.runTick('job', at(30));
        expect(await statusOf(schema, 'job', at(10))).toEqual(['MISSED']);
      }),
    30_000,
  );

  test(
    'scheduler.missed-reported-when-committed',
    "catch-up's 'missed' event names only ticks whose MISSED rows committed: a run stop() rolls back reports none, and the node after it reports them once",
    () =>
      withSchema(async (schema) => {
        const clock = handClock(0);
        const started = gate();
        const missed: number[][] = [];
        const onMissed = (e: SchedulerEvent) => {
          if (e.type === 'missed') missed.push(e.ticks.map((t) => (t.getTime() - BASE) / 1000));
        };
        const handler = async (run: { readonly tick: Date; readonly signal: AbortSignal }) => {
          if (run.tick.getTime() !== at(10).getTime()) return;
          started.open();
          await aborted(run.signal, 20_000);
          throw new Error('stopped');
        };
        const a = node(schema, { owner: 'a', now: clock.now, catchUpGraceMs: 0 });
        a.register('job', '* * * * * *', handler);
        a.on('missed', onMissed);
        await a.runTick('job', at(0));
        clock.set(10);
        const aRun = a.runTick('job', at(10));
        await started.promise;
        await a.stop(); // the run rolls back, its catch-up records with it; tick 10 is given back
        await aRun;
        expect(missed, 'nothing A reported committed').toEqual([]);
        expect(await statusOf(schema, 'job', at(5))).toEqual([]);
        const b = node(schema, { owner: 'b', now: clock.now, catchUpGraceMs: 0 });
        const ranB: number[] = [];
        b.register('job', '* * * * * *', (run) => {
          ranB.push((run.tick.getTime() - BASE) / 1000);
        });
        b.on('missed', onMissed);
        clock.set(11);
        await b.runTick('job', at(11));
        await b.stop();
        expect(missed).toEqual([[1, 2, 3, 4, 5, 6, 7, 8, 9]]);
        expect(await statusOf(schema, 'job', at(5))).toEqual(['MISSED']);
        expect(ranB, 'B runs its tick, then the one A gave back').toEqual([11, 10]);
      }),
    30_000,
  );

  test(
    'scheduler.queue-oldest-first',
    "overlap 'queue', in transaction and lease mode: a tick fired while older queued ticks are due waits behind them; they run oldest first",
    () =>
      withSchema(async (schema) => {
        for (const mode of ['transaction', 'lease'] as const) {
          const job = `job-${mode}`;
          const ran: number[] = [];
          const started = gate();
          const release = gate();
          const options = { mode, overlap: 'queue', claimTimeoutMs: 200 } as const;
          const handler = async (run: { readonly tick: Date }) => {
            ran.push((run.tick.getTime() - BASE) / 1000);
            if (run.tick.getTime() === at(1).getTime()) {
              started.open();
              await release.promise;
            }
          };
          // A runs tick 1. Its clock is behind: when its run ends, nothing queued is due for it yet.
          const a = node(schema, {
            owner: 'a',
            now: handClock(1).now,
            clock: heldTimers(),
            catchUpGraceMs: 0,
          });
          a.register(job, '* * * * * *', handler, options);
          const b = node(schema, {
            owner: 'b',
            now: handClock(4).now,
            clock: heldTimers(),
            catchUpGraceMs: 0,
          });
          b.register(job, '* * * * * *', handler, options);
          const first = a.runTick(job, at(1));
          await started.promise;
          try {
            await b.runTick(job, at(2)); // queued behind the run of tick 1
            await b.runTick(job, at(3));
          } finally {
            release.open();
            await first;
          }
          // Tick 4 fires while 2 and 3 wait, due: they run first.
          await b.runTick(job, at(4));
          await Promise.all([a.stop(), b.stop()]);
          expect(ran, mode).toEqual([1, 2, 3, 4]);
          for (const t of [1, 2, 3, 4])
            expect(await statusOf(schema, job, at(t)), `${mode} tick ${t}`).toEqual(['SUCCEEDED']);
        }
      }),
    30_000,
  );

  test(
    'scheduler.queue-due-tick-waits-its-turn',
    "overlap 'queue': a node that was waiting for the job's lock to fire a tick, and finds it queued by another node meanwhile, runs the older queued ticks first",
    () =>
      withSchema(async (schema) => {
        const job = 'job';
        const ran: number[] = [];
        const started = gate();
        const release = gate();
        const handler = async (run: { readonly tick: Date }) => {
          ran.push((run.tick.getTime() - BASE) / 1000);
          if (run.tick.getTime() === at(1).getTime()) {
            started.open();
            await release.promise;
          }
        };
        const options = { overlap: 'queue', claimTimeoutMs: 200 } as const;
        // R runs tick 1; its clock is behind, so when its run ends nothing queued is due for it.
        const r = node(schema, {
          owner: 'r',
          now: handClock(1).now,
          clock: heldTimers(),
          catchUpGraceMs: 0,
        });
        r.register(job, '* * * * * *', handler, options);
        const q = node(schema, {
          owner: 'q',
          now: handClock(3).now,
          clock: heldTimers(),
          catchUpGraceMs: 0,
        });
        q.register(job, '* * * * * *', handler, options);
        const d = node(schema, {
          owner: 'd',
          now: handClock(3).now,
          clock: heldTimers(),
          catchUpGraceMs: 0,
        });
        d.register(job, '* * * * * *', handler, { ...options, claimTimeoutMs: 20_000 });
        const first = r.runTick(job, at(1));
        await started.promise;
        let late: Promise<void> | undefined;
        try {
          await q.runTick(job, at(2)); // queued behind the run of tick 1
          late = d.runTick(job, at(3)); // D waits for the job's lock to fire tick 3
          expect(await someoneWaits()).toBe(true);
          await q.runTick(job, at(3)); // meanwhile Q queues tick 3 behind tick 2
        } finally {
          release.open();
          await first;
          await late; // D finds tick 3 queued and due: tick 2 is older
        }
        await Promise.all([r.stop(), q.stop(), d.stop()]);
        expect(ran).toEqual([1, 2, 3]);
      }),
    30_000,
  );

  /**
   * Two nodes on a per-second job: `a` (clock `clockA`) runs tick 0 and is held in its handler
   * until `release`; the handler records `owner tick` in `ran`. Tick 0 only is held.
   */
  const queueNodes = (
    schema: string,
    mode: 'transaction' | 'lease',
    job: string,
    clocks: { readonly a: SchedulerOptions; readonly b: SchedulerOptions },
  ) => {
    const ran: string[] = [];
    const started = gate();
    const release = gate();
    const make = (owner: string, options: SchedulerOptions) => {
      // A node given only `now` keeps its timers held (see heldTimers); a case that moves a
      // node's timers passes its own clock.
      const s = node(schema, { owner, catchUpGraceMs: 0, clock: heldTimers(), ...options });
      s.register(
        job,
        '* * * * * *',
        async (run: { readonly tick: Date }) => {
          const n = (run.tick.getTime() - BASE) / 1000;
          ran.push(`${owner} ${n}`);
          if (n === 0) {
            started.open();
            await release.promise;
          }
        },
        // Lease mode: a fresh tick that finds the lease held is queued at once (overlap 'queue').
        mode === 'lease'
          ? { mode, overlap: 'queue', lease: { ttlMs: 10_000 }, claimTimeoutMs: 20_000 }
          : { mode, overlap: 'queue', claimTimeoutMs: 200 },
      );
      return s;
    };
    return { ran, started, release, a: make('a', clocks.a), b: make('b', clocks.b) };
  };

  test(
    'scheduler.queue-skewed-due-at-tick',
    "overlap 'queue', in transaction and lease mode: a tick queued by a node whose clock runs 500 ms ahead is due at its own time on every clock — the runner, whose run ends 100 ms before that tick on its clock, runs it when its own timer fires it (it was left PENDING: 'waiting')",
    () =>
      withSchema(async (schema) => {
        for (const mode of ['transaction', 'lease'] as const) {
          const job = `job-${mode}`;
          let tA = BASE;
          let tB = BASE + 500;
          const n = queueNodes(schema, mode, job, {
            a: { now: () => tA },
            b: { now: () => tB },
          });
          const first = n.a.runTick(job, at(0));
          await n.started.promise;
          try {
            // B, 500 ms ahead, fires tick 1 while A still runs tick 0: queued.
            tA = BASE + 900;
            tB = BASE + 1400;
            await n.b.runTick(job, at(1));
            expect(await statusOf(schema, job, at(1)), mode).toEqual(['PENDING']);
          } finally {
            n.release.open();
            await first; // A's run ends at 0.9 s on its clock: tick 1 is not due for it yet
          }
          expect(n.ran, `${mode}: not run before its time on A's clock`).toEqual(['a 0']);
          tA = BASE + 1000;
          tB = BASE + 1500;
          await n.a.runTick(job, at(1)); // A's timer fires tick 1 at its time
          await Promise.all([n.a.stop(), n.b.stop()]);
          expect(n.ran, mode).toEqual(['a 0', 'a 1']);
          expect(await statusOf(schema, job, at(1)), mode).toEqual(['SUCCEEDED']);
        }
      }),
    30_000,
  );

  test(
    'scheduler.pending-not-due-followed-up',
    "overlap 'queue', in transaction and lease mode: a node whose drain leaves a queued tick not yet due on its clock keeps a timer for it and runs it then — without firing that tick itself",
    () =>
      withSchema(async (schema) => {
        for (const mode of ['transaction', 'lease'] as const) {
          const job = `job-${mode}`;
          const clockA = new SimulatedClock(BASE);
          let tB = BASE + 500;
          const n = queueNodes(schema, mode, job, {
            a: { clock: clockA },
            b: { now: () => tB },
          });
          const ranByA = gate();
          n.a.on('ran', (e) => {
            if (e.tick.getTime() === at(1).getTime()) ranByA.open();
          });
          const first = n.a.runTick(job, at(0));
          await n.started.promise;
          try {
            await clockA.advanceTo(BASE + 900);
            tB = BASE + 1400;
            await n.b.runTick(job, at(1)); // queued by B, due at 1 s
          } finally {
            n.release.open();
            await first; // A's drain at 0.9 s leaves tick 1: not due on A's clock
          }
          expect(n.ran, mode).toEqual(['a 0']);
          await clockA.advanceTo(BASE + 1000); // A's follow-up, not a firing of tick 1
          const followed = await Promise.race([
            ranByA.promise.then(() => true),
            new Promise<false>((r) => setTimeout(r, 10_000, false)),
          ]);
          expect(followed, `${mode}: A ran tick 1 on its follow-up`).toBe(true);
          await Promise.all([n.a.stop(), n.b.stop()]);
          expect(n.ran, mode).toEqual(['a 0', 'a 1']);
          expect(await statusOf(schema, job, at(1)), mode).toEqual(['SUCCEEDED']);
        }
      }),
    30_000,
  );

  test(
    'scheduler.queue-committed-after-drain',
    "overlap 'queue', in transaction and lease mode, two nodes and one alone: a tick whose PENDING row commits just after the run it queued behind ended and looked for due ticks is run — the queuing node looks again after its commit",
    () =>
      withSchema(async (schema) => {
        const f = fixture();
        for (const mode of ['transaction', 'lease'] as const)
          for (const nodes of ['two nodes', 'one node'] as const) {
            const job = `job-${mode}-${nodes.replace(' ', '-')}`;
            const clock = handClock(0);
            const n = queueNodes(schema, mode, job, {
              a: { now: clock.now },
              b: { now: clock.now },
            });
            const queuer = nodes === 'two nodes' ? n.b : n.a;
            // An outside transaction holds an uncommitted row of tick 1: the queuing node's
            // INSERT of it waits there — after it judged the job busy, before its commit — as a
            // slow network between its statements would. The row is rolled back, never seen.
            const outside = await Observer.connect(
              f.adapter.observerUrl?.() ?? f.adapter.databaseUrl(),
            );
            const first = n.a.runTick(job, at(0));
            let queued: Promise<void> | undefined;
            try {
              await n.started.promise;
              await outside.query('BEGIN');
              await outside.query(
                `INSERT INTO "${schema}".runs (namespace, job, tick, status, attempt, retry_at)
                 VALUES ($1, $2, $3, 'PENDING', 0, $3)`,
                [schema, job, at(1).toISOString()],
              );
              const [{ pid } = { pid: 0 }] = await outside.query<{ pid: number }>(
                'SELECT pg_backend_pid() AS pid',
              );
              clock.set(1);
              queued = queuer.runTick(job, at(1));
              const waiting = await f.observer.until(
                async () =>
                  (
                    await f.observer.query(
                      `SELECT 1 FROM pg_locks w
                        WHERE w.locktype = 'transactionid' AND NOT w.granted
                          AND w.transactionid = (SELECT h.transactionid FROM pg_locks h
                                                  WHERE h.pid = $1 AND h.granted
                                                    AND h.locktype = 'transactionid' LIMIT 1)`,
                      [pid],
                    )
                  ).length === 1,
                10_000,
              );
              expect(waiting, `${mode}, ${nodes}: the queuing INSERT waits`).toBe(true);
              n.release.open();
              await first; // tick 0 ends, and its drain finds nothing committed
              await outside.query('ROLLBACK');
              await queued;
            } finally {
              n.release.open();
              await outside.query('ROLLBACK').catch(() => undefined);
              await outside.close();
              await first;
              await queued;
              await Promise.all([n.a.stop(), n.b.stop()]);
            }
            expect(n.ran, `${mode}, ${nodes}`).toEqual([
              'a 0',
              nodes === 'two nodes' ? 'b 1' : 'a 1',
            ]);
            expect(await statusOf(schema, job, at(1)), `${mode}, ${nodes}`).toEqual(['SUCCEEDED']);
          }
      }),
    60_000,
  );

  test(
    'scheduler.queue-holder-stopping',
    "overlap 'queue', in transaction and lease mode: a tick queued behind a run whose node is stopping (it runs no queue once its run ends) is run by the node that queued it, claimTimeoutMs later on that node's clock — not at the job's next firing",
    () =>
      withSchema(async (schema) => {
        for (const mode of ['transaction', 'lease'] as const) {
          const job = `job-${mode}`;
          const clockB = new SimulatedClock(BASE + 1010);
          const n = queueNodes(schema, mode, job, {
            a: { now: () => BASE + 1010 },
            b: { clock: clockB },
          });
          const ranByB = gate();
          n.b.on('ran', (e) => {
            if (e.tick.getTime() === at(1).getTime()) ranByB.open();
          });
          const first = n.a.runTick(job, at(0));
          let stopped: Promise<unknown> | undefined;
          try {
            await n.started.promise;
            // A holds the job: B queues tick 1, and finds the job still held after its commit.
            await n.b.runTick(job, at(1));
            expect(await statusOf(schema, job, at(1)), mode).toEqual(['PENDING']);
            // A is told to stop while its run goes on; once the run ends it runs no queue.
            stopped = n.a.stop({ timeoutMs: 10_000 });
          } finally {
            n.release.open();
            await first;
            await stopped;
          }
          expect(n.ran, `${mode}: A ran tick 0 only`).toEqual(['a 0']);
          expect(await statusOf(schema, job, at(1)), `${mode}: still queued`).toEqual(['PENDING']);
          const claimTimeoutMs = mode === 'lease' ? 20_000 : 200;
          await clockB.advanceTo(BASE + 1010 + claimTimeoutMs);
          const ran = await Promise.race([
            ranByB.promise.then(() => true),
            new Promise<false>((r) => setTimeout(r, 10_000, false)),
          ]);
          expect(ran, `${mode}: B ran the queued tick on its own timer`).toBe(true);
          await n.b.stop();
          expect(n.ran, mode).toEqual(['a 0', 'b 1']);
          expect(await statusOf(schema, job, at(1)), mode).toEqual(['SUCCEEDED']);
        }
      }),
    60_000,
  );

  test(
    'scheduler.stop-gives-back-skewed',
    'in transaction and lease mode: a tick given back at stop() by a node whose clock runs 500 ms ahead is due for the replacement at once on its own clock, and runs with its next tick',
    () =>
      withSchema(async (schema) => {
        for (const mode of ['transaction', 'lease'] as const) {
          const job = `job-${mode}`;
          let tOld = BASE + 500;
          let tNew = BASE;
          const ran: string[] = [];
          const started = gate();
          const make = (owner: string, now: () => number) => {
            const s = node(schema, { owner, now, catchUpGraceMs: 0 });
            s.register(
              job,
              '* * * * * *',
              async (run) => {
                ran.push(`${owner} ${(run.tick.getTime() - BASE) / 1000}`);
                if (owner !== 'old') return;
                started.open();
                await aborted(run.signal, 10_000);
                throw run.signal.reason;
              },
              mode === 'lease' ? { mode, lease: { ttlMs: 10_000 } } : { mode },
            );
            return s;
          };
          const old = make('old', () => tOld);
          const fresh = make('new', () => tNew);
          const running = old.runTick(job, at(0));
          await started.promise;
          tOld = BASE + 1400; // 0.9 s on the replacement's clock
          tNew = BASE + 900;
          await old.stop({ timeoutMs: 5000 });
          await running;
          expect(await statusOf(schema, job, at(0)), mode).toEqual(['PENDING']);
          tNew = BASE + 1000;
          await fresh.runTick(job, at(1));
          await fresh.stop();
          expect(ran, `${mode}: the replacement runs its tick, then the given-back one`).toEqual([
            'old 0',
            'new 1',
            'new 0',
          ]);
          expect(await statusOf(schema, job, at(0)), mode).toEqual(['SUCCEEDED']);
        }
      }),
    30_000,
  );

  test(
    'scheduler.caught-sql-error-is-failed',
    'a transaction-mode handler that catches its own SQL error and returns: its work cannot commit, so the tick is recorded FAILED (COMMIT_ROLLED_BACK), never SUCCEEDED and never left without a row',
    () =>
      withSchema(async (schema) => {
        const clock = handClock(1);
        const s = node(schema, { now: clock.now, catchUpGraceMs: 0 });
        const events: SchedulerEvent[] = [];
        s.register('job', '* * * * * *', async (run) => {
          if (run.mode !== 'transaction') throw new Error('mode');
          await run.query('SELECT 1 / 0').catch(() => {});
        });
        for (const type of ['ran', 'failed', 'error'] as const) s.on(type, (e) => events.push(e));
        await s.runTick('job', at(1));
        const [event] = events;
        expect(events).toHaveLength(1);
        const error = event && 'error' in event ? event.error : undefined;
        // A driver that keeps a failed statement's error for the whole transaction (drizzle on
        // postgres.js) fails the transaction whatever lockkit sends next: nothing commits, the
        // tick keeps no row (catch-up decides) and the 'error' event carries the handler's own
        // error (22012) or COMMIT_ROLLED_BACK. Every other driver records the failed attempt.
        if (event?.type === 'error') {
          expect(sqlState(error) === '22012' || isLockkitError(error)).toBe(true);
          if (isLockkitError(error)) expect(error.code).toBe('COMMIT_ROLLED_BACK');
          expect(await statusOf(schema, 'job', at(1))).toEqual([]);
        } else {
          expect(event?.type).toBe('failed');
          expect(error).toMatchObject({ code: 'COMMIT_ROLLED_BACK' });
          expect(await statusOf(schema, 'job', at(1))).toEqual(['FAILED']);
        }
        await s.stop();
      }),
    30_000,
  );

  test(
    'scheduler.timeout-bounds-handler',
    'timeoutMs and a client statement_timeout bound the handler, not the wait for the job: an overlap stays SKIPPED_OVERLAP',
    () =>
      withSchema(async (schema) => {
        const f = fixture();
        const clock = handClock(1);
        const started = gate();
        const release = gate();
        const holder = node(schema, { now: clock.now, catchUpGraceMs: 0 });
        holder.register('job', '* * * * * *', async () => {
          started.open();
          await release.promise;
        });
        const events: SchedulerEvent[] = [];
        const cut: (string | undefined)[] = [];
        const short = node(schema, { now: clock.now, catchUpGraceMs: 0 });
        short.register(
          'job',
          '* * * * * *',
          async (run) => {
            if (run.mode !== 'transaction') throw new Error('mode');
            try {
              await run.query('SELECT pg_sleep(2)');
            } catch (error) {
              cut.push(sqlState(error));
              throw error;
            }
          },
          { timeoutMs: 100, claimTimeoutMs: 500 },
        );
        const clientWide = createScheduler(
          createLockClient(f.newInstance(3).executor, { schema, statementTimeoutMs: 100 }),
          { namespace: schema, now: clock.now, catchUpGraceMs: 0 },
        );
        clientWide.register('job', '* * * * * *', () => {}, { claimTimeoutMs: 500 });
        for (const s of [short, clientWide])
          for (const type of ['skipped-held', 'error', 'missed', 'failed'] as const)
            s.on(type, (e) => events.push(e));
        const holding = holder.runTick('job', at(1));
        await started.promise;
        try {
          await short.runTick('job', at(2));
          await clientWide.runTick('job', at(3));
        } finally {
          release.open();
          await holding;
        }
        expect(events.map((e) => e.type)).toEqual(['skipped-held', 'skipped-held']);
        expect(await statusOf(schema, 'job', at(2))).toEqual(['SKIPPED_OVERLAP']);
        expect(await statusOf(schema, 'job', at(3))).toEqual(['SKIPPED_OVERLAP']);
        // The handler itself is bounded: two seconds of sleep against timeoutMs 100. (Whether its
        // FAILED row can commit after the failed statement is the driver's affair: drizzle on
        // postgres.js fails the whole transaction, and the tick stays free.)
        clock.set(5);
        await short.runTick('job', at(5));
        expect(cut).toEqual(['57014']);
        expect(await statusOf(schema, 'job', at(5))).not.toContain('SUCCEEDED');
        await Promise.all([holder.stop(), short.stop(), clientWide.stop()]);
      }),
    30_000,
  );

  test(
    'scheduler.stop-gives-back',
    'stop() during a run, in transaction and lease mode, gives the tick back: no failure, no willRetry, and the replacement runs it',
    () =>
      withSchema(async (schema) => {
        for (const mode of ['transaction', 'lease'] as const) {
          const job = `job-${mode}`;
          const clock = handClock(1);
          const started = gate();
          const events: SchedulerEvent[] = [];
          const old = node(schema, { owner: 'old', now: clock.now, catchUpGraceMs: 0 });
          old.register(
            job,
            '* * * * * *',
            async (run) => {
              if (run.tick.getTime() !== at(2).getTime()) return;
              started.open();
              await aborted(run.signal, 10_000);
              throw run.signal.reason;
            },
            { mode, retries: 1 },
          );
          for (const type of ['failed', 'error', 'lease-lost'] as const)
            old.on(type, (e) => events.push(e));
          await old.runTick(job, at(1));
          clock.set(2);
          const running = old.runTick(job, at(2));
          await started.promise;
          await old.stop({ timeoutMs: 5000 });
          await running;
          expect(events, `${mode}: no failure reported`).toEqual([]);
          const ran: number[] = [];
          const fresh = node(schema, { owner: 'new', now: clock.now, catchUpGraceMs: 0 });
          fresh.register(
            job,
            '* * * * * *',
            (run) => {
              ran.push((run.tick.getTime() - BASE) / 1000);
            },
            { mode, catchUp: 'skip' },
          );
          clock.set(3);
          await fresh.runTick(job, at(3));
          expect(ran.sort(), `${mode}: the replacement ran the given-back tick`).toEqual([2, 3]);
          expect(await statusOf(schema, job, at(2))).toEqual(['SUCCEEDED']);
          await fresh.stop();
        }
      }),
    30_000,
  );

  test(
    'scheduler.retry-durable',
    'a retry waits retryDelayMs on every node, and survives the node that failed stopping',
    () =>
      withSchema(async (schema) => {
        const attempts: { tick: number; attempt: number; at: number; by: string }[] = [];
        const make = (owner: string, clock: { now: () => number }) => {
          const s = node(schema, { owner, now: clock.now, catchUpGraceMs: 0 });
          s.register(
            'job',
            '* * * * * *',
            (run) => {
              attempts.push({
                tick: (run.tick.getTime() - BASE) / 1000,
                attempt: run.attempt,
                at: clock.now() - BASE,
                by: owner,
              });
              if (run.attempt === 1 && run.tick.getTime() === at(1).getTime())
                throw new Error('first attempt fails');
            },
            { retries: 1, retryDelayMs: 3000 },
          );
          return s;
        };
        const clockA = handClock(1);
        const a = make('a', clockA);
        await a.runTick('job', at(1));
        await a.stop(); // its retry must not live only in its memory
        const clockB = handClock(1);
        clockB.set(1.5);
        const b = make('b', clockB);
        await b.runTick('job', at(1)); // a late node, 0.5 s after the failure: too early to retry
        expect(attempts.filter((x) => x.attempt === 2)).toEqual([]);
        clockB.set(4.5);
        await b.runTick('job', at(4)); // the retry is due (1 s + 3 s): b runs it
        expect(attempts.filter((x) => x.tick === 1)).toEqual([
          { tick: 1, attempt: 1, at: 1010, by: 'a' },
          { tick: 1, attempt: 2, at: 4510, by: 'b' },
        ]);
        expect(await rows(schema, 'job')).toContainEqual(
          expect.objectContaining({ status: 'SUCCEEDED', attempt: 2 }),
        );
        await b.stop();
      }),
    30_000,
  );

  test(
    'scheduler.namespaces',
    'two schedulers with different namespaces in one schema share neither ledger rows nor locks',
    () =>
      withSchema(async (schema) => {
        const clock = handClock(1);
        const started = gate();
        const release = gate();
        const a = node(schema, { namespace: 'app-a', now: clock.now, catchUpGraceMs: 0 });
        const b = node(schema, { namespace: 'app-b', now: clock.now, catchUpGraceMs: 0 });
        const ran: string[] = [];
        a.register('report', '* * * * * *', async () => {
          ran.push('a');
          started.open();
          await release.promise;
        });
        b.register(
          'report',
          '* * * * * *',
          () => {
            ran.push('b');
          },
          { claimTimeoutMs: 200 },
        );
        const aRun = a.runTick('report', at(1));
        await started.promise;
        try {
          await b.runTick('report', at(1)); // not blocked by a's run of the same name
          expect(ran).toEqual(['a', 'b']);
        } finally {
          release.open();
          await aRun;
        }
        expect((await rows(schema, 'report')).map((r) => r.status)).toEqual([
          'SUCCEEDED',
          'SUCCEEDED',
        ]);
        await Promise.all([a.stop(), b.stop()]);
      }),
    30_000,
  );

  test(
    'scheduler.schedule-conflict',
    'two instances registering one job with different schedules: an event and a doctor warning, not a silent merge',
    () =>
      withSchema(async (schema) => {
        const f = fixture();
        const conflicts: SchedulerEvent[] = [];
        const make = (owner: string, cron: string) => {
          const s = node(schema, { owner });
          s.register('sync', cron, () => {});
          s.on('schedule-conflict', (e) => conflicts.push(e));
          return s;
        };
        const one = make('one', '0 0 * * * *');
        const same = make('same', '0 0 * * * *');
        await one.start();
        await same.start();
        expect(conflicts).toEqual([]);
        const other = make('two', '0 30 * * * *');
        await other.start();
        expect(conflicts).toHaveLength(1);
        expect(conflicts[0]).toMatchObject({ type: 'schedule-conflict', job: 'sync' });
        const crons =
          conflicts[0]?.type === 'schedule-conflict'
            ? conflicts[0].schedules.map((r) => `${r.owner} ${r.cron}`).sort()
            : [];
        expect(crons).toEqual(['one 0 0 * * * *', 'same 0 0 * * * *', 'two 0 30 * * * *']);
        const checks = await doctor(f.instance.executor, { schema });
        expect(checks.find((c) => c.id === 'schedule-conflict')).toMatchObject({
          level: 'warn',
          message: expect.stringContaining('sync'),
        });
        await Promise.all([one.stop(), same.stop(), other.stop()]);
        const after = await doctor(f.instance.executor, { schema });
        expect(after.find((c) => c.id === 'schedule-conflict')?.level).toBe('ok');
      }),
    30_000,
  );
}
