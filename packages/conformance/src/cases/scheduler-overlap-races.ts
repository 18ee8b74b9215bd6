/**
 * The scheduler's overlap judgement against a runner caught between its two locks (issue 24).
 *
 * A node that runs a tick takes the job's lock, then — one statement later — the tick's own lock.
 * A node whose wait for the job's lock timed out judges who holds it; a transaction holding the
 * job's lock without the tick's may be a run of this very tick, between its two statements (alive:
 * it goes on; dying: Postgres may free its tick lock a moment before its job lock). Such a tick
 * must never be recorded SKIPPED_OVERLAP. Each case holds the runner exactly there, with a gate on
 * the first statement it sends once the job's lock is granted — no timing window: the other node
 * is let judge (its second attempt at the job's lock proves it judged and came back), and only then
 * is the runner let go on, or killed.
 */
import { randomBytes } from 'node:crypto';
import {
  createLockClient,
  createScheduler,
  type JobHandler,
  type LockExecutor,
  LockKey,
  type LockkitEvent,
  SCHEDULER_NAMESPACE,
  type TransactionContext,
} from '@lockkit/core';
import { expect } from 'vitest';
import { type ConformanceAdapter, gate } from '../harness.js';
import { casesOf, type Fixture, withLockkitSchema } from '../suite.js';

/** A whole minute far from now: no real timer reaches it. */
const BASE = Date.UTC(2031, 0, 1, 0, 0, 0);
const TICK = new Date(BASE);
const now = () => BASE + 10;

/**
 * A job name of this run alone: a job's lock key does not depend on the schema, so two runs of
 * the suite on one database (other adapters, other checkouts) must not share a name.
 */
const jobName = () => `job-${randomBytes(6).toString('hex')}`;

/** The lock key of scheduler job `name` outside any namespace, as `pg_locks` and events show it. */
const jobLock = (name: string) => LockKey.fromNames(SCHEDULER_NAMESPACE, name);
const sameKey = (a: LockKey, b: LockKey) =>
  a.pgLocks.classid === b.pgLocks.classid &&
  a.pgLocks.objid === b.pgLocks.objid &&
  a.pgLocks.objsubid === b.pgLocks.objsubid;

/** What a gated executor reports once it is held: the backend holding the job's lock. */
interface HeldRunner {
  readonly pid: number;
}

/**
 * `base`, except that once `arm()` is called, the statement after the next `pass` ones waits for
 * `release` — after asking the backend's pid on that same connection (inside the transaction that
 * holds the job's lock), reported through `reached`.
 */
function holdingAfterArm<Tx, Session>(
  base: LockExecutor<Tx, Session>,
  reached: (held: HeldRunner) => void,
  release: Promise<void>,
  pass = 0,
): { readonly executor: LockExecutor<Tx, Session>; readonly arm: () => void } {
  let state: 'idle' | 'armed' | 'fired' = 'idle';
  let passed = 0;
  const wrap = (ctx: TransactionContext<Tx>): TransactionContext<Tx> => {
    const query: TransactionContext<Tx>['query'] = async (text, params) => {
      if (state === 'armed' && passed++ >= pass) {
        state = 'fired';
        const [row] = await ctx.query('SELECT pg_backend_pid() AS pid');
        reached({ pid: Number(row?.pid) });
        await release;
      }
      return ctx.query(text, params);
    };
    // The context's other members may be getters over the connection's fate: keep them live.
    return Object.create(ctx, { query: { value: query } }) as TransactionContext<Tx>;
  };
  const pipelined = base.pipelinedTransaction?.bind(base);
  const pipelinedTransaction: LockExecutor<Tx, Session>['pipelinedTransaction'] =
    pipelined &&
    ((first, fn, beforeSend) => pipelined(first, (ctx, rows) => fn(wrap(ctx), rows), beforeSend));
  const executor: LockExecutor<Tx, Session> = {
    name: base.name,
    ...(base.transactionPooler !== undefined && { transactionPooler: base.transactionPooler }),
    transaction: (fn) => base.transaction((ctx) => fn(wrap(ctx))),
    ...(pipelinedTransaction && { pipelinedTransaction }),
  };
  return {
    executor,
    arm: () => {
      if (state === 'idle') state = 'armed';
    },
  };
}

/** Overlap-judgement race cases of the scheduler. */
export function schedulerOverlapRaceCases<Tx, Session>(
  adapter: ConformanceAdapter<Tx, Session>,
  fixture: () => Fixture<Tx, Session>,
): void {
  const test = casesOf(adapter);

  const statusOf = async (schema: string, job: string) =>
    (
      await fixture().observer.query<{ status: string; attempt: number }>(
        `SELECT status, attempt FROM "${schema}".runs WHERE job = $1 AND tick = $2`,
        [job, TICK.toISOString()],
      )
    ).map((r) => `${r.status} ${r.attempt}`);

  /** A handler that records who ran which tick (seconds after BASE) in `ran`. */
  const recorder =
    (ran: string[], owner: string): JobHandler<Tx> =>
    (run) => {
      ran.push(`${owner} ${(run.tick.getTime() - BASE) / 1000}`);
    };

  /**
   * Node A: once it is granted the job's lock, the statement after the next `pass` ones is held
   * until `release()`; `reached` resolves then with the backend holding the job's lock.
   */
  const heldNode = (schema: string, job: string, pass: number) => {
    const reached = gate<HeldRunner>();
    const release = gate();
    const held = holdingAfterArm(
      fixture().newInstance(3).executor,
      reached.open,
      release.promise,
      pass,
    );
    const key = jobLock(job);
    const scheduler = createScheduler(
      createLockClient(held.executor, {
        schema,
        onEvent: (e: LockkitEvent) => {
          if (e.type === 'lock-acquired' && sameKey(e.key, key)) held.arm();
        },
      }),
      { owner: 'a', now, catchUpGraceMs: 0 },
    );
    return { scheduler, reached: reached.promise, release: () => release.open() };
  };

  /**
   * Node B, with a short claim wait: `cameBack` resolves at its second attempt at the job's lock,
   * i.e. once it has timed out, judged, and come back to wait.
   */
  const judgingNode = (schema: string, job: string, clock: () => number) => {
    const key = jobLock(job);
    const cameBack = gate<'waits again'>();
    let attempts = 0;
    const scheduler = createScheduler(
      createLockClient(fixture().newInstance(3).executor, {
        schema,
        onEvent: (e: LockkitEvent) => {
          if (e.type === 'lock-attempt' && sameKey(e.key, key) && ++attempts === 2)
            cameBack.open('waits again');
        },
      }),
      { owner: 'b', now: clock, catchUpGraceMs: 0 },
    );
    return { scheduler, cameBack: cameBack.promise };
  };

  /**
   * Node A fires the tick and is held right after the job's lock is granted; node B fires the same
   * tick, times out on the job's lock and judges; then A goes on (`fate` 'goes-on') or its backend
   * is terminated ('dies'). The tick must run exactly once: by A, or by B once A is gone.
   */
  const heldBetweenLocks = (mode: 'transaction' | 'lease', fate: 'goes-on' | 'dies') =>
    withLockkitSchema(fixture(), async (schema) => {
      const f = fixture();
      const job = jobName();
      const ran: string[] = [];
      const options = mode === 'lease' ? ({ mode: 'lease', lease: { ttlMs: 5000 } } as const) : {};
      const a = heldNode(schema, job, 0);
      a.scheduler.register(job, '* * * * * *', recorder(ran, 'a'), options);
      const b = judgingNode(schema, job, now);
      b.scheduler.register(job, '* * * * * *', recorder(ran, 'b'), {
        ...options,
        claimTimeoutMs: 200,
      });
      const aRun = a.scheduler.runTick(job, TICK);
      const bRun = (async () => {
        const runner = await a.reached; // A holds the job's lock, its next statement held
        const done = b.scheduler.runTick(job, TICK);
        // B judged: either it settled the tick at once, or it came back to wait for the job's lock.
        await Promise.race([done, b.cameBack]);
        if (fate === 'dies') await f.observer.terminate(runner.pid);
        else a.release();
        await done;
      })();
      try {
        await bRun;
      } finally {
        a.release(); // a dead runner goes on only now, to find its connection gone
        await aRun;
      }
      expect(ran).toEqual([fate === 'dies' ? 'b 0' : 'a 0']);
      expect(await statusOf(schema, job)).toEqual(['SUCCEEDED 1']);
      await Promise.all([a.scheduler.stop(), b.scheduler.stop()]);
    });

  test(
    'scheduler.runner-between-locks-not-skipped',
    "a node whose wait for the job's lock timed out while this tick's runner held the job's lock but had not yet sent its tick-lock statement does not record the tick skipped; the runner runs it once",
    () => heldBetweenLocks('transaction', 'goes-on'),
    30_000,
  );

  test(
    'scheduler.runner-dies-between-locks-not-skipped',
    "a node that judged while this tick's runner held the job's lock without the tick's (as a dying runner does once Postgres has freed its tick lock) does not record the tick skipped; it runs the tick once that runner is terminated",
    () => heldBetweenLocks('transaction', 'dies'),
    30_000,
  );

  test(
    'scheduler.lease-claimant-held-not-skipped',
    "lease mode: a node whose wait for the job's lock timed out while a claimant of the same tick held it does not record the tick skipped; the claimant runs it once",
    () => heldBetweenLocks('lease', 'goes-on'),
    30_000,
  );

  test(
    'scheduler.lease-claimant-dies-not-skipped',
    "lease mode: a node whose wait for the job's lock timed out while a claimant of the same tick held it runs the tick once that claimant is terminated, instead of recording it skipped",
    () => heldBetweenLocks('lease', 'dies'),
    30_000,
  );

  test(
    'scheduler.lease-stuck-claim-of-another-tick-overlaps',
    "lease mode: a node whose wait for the job's lock timed out while a claim of an EARLIER tick held it (with that tick's lock) records its own tick SKIPPED_OVERLAP; the earlier tick still runs once",
    () =>
      withLockkitSchema(fixture(), async (schema) => {
        const f = fixture();
        const job = jobName();
        const ran: string[] = [];
        const lease = { mode: 'lease', lease: { ttlMs: 5000 } } as const;
        // A's claim of tick 0: the job's lock, then the tick's lock (let through), then held.
        const a = heldNode(schema, job, 1);
        a.scheduler.register(job, '* * * * * *', recorder(ran, 'a'), lease);
        const b = judgingNode(schema, job, () => BASE + 1000 + 10);
        b.scheduler.register(job, '* * * * * *', recorder(ran, 'b'), {
          ...lease,
          claimTimeoutMs: 200,
        });
        const skipped: string[] = [];
        b.scheduler.on('skipped-held', (e) => skipped.push(`${(e.tick.getTime() - BASE) / 1000}`));
        const aRun = a.scheduler.runTick(job, TICK);
        let bRun: Promise<void> | undefined;
        try {
          await a.reached; // A's claim of tick 0 holds the job's lock and tick 0's lock
          bRun = b.scheduler.runTick(job, new Date(BASE + 1000));
          // B times out and judges: an overlap, settled at once — not a wait for A's claim.
          const judged = await Promise.race([bRun.then(() => 'settled'), b.cameBack]);
          expect(judged).toBe('settled');
        } finally {
          a.release();
          await aRun;
          await bRun;
        }
        expect(skipped).toEqual(['1']);
        expect(ran).toEqual(['a 0']);
        const rows = await f.observer.query<{ tick: Date; status: string }>(
          `SELECT tick, status FROM "${schema}".runs WHERE job = $1 ORDER BY tick`,
          [job],
        );
        expect(
          rows.map((r) => `${(new Date(r.tick).getTime() - BASE) / 1000} ${r.status}`),
        ).toEqual(['0 SUCCEEDED', '1 SKIPPED_OVERLAP']);
        await Promise.all([a.scheduler.stop(), b.scheduler.stop()]);
      }),
    30_000,
  );
}
