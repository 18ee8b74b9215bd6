/**
 * The ledger's retention against a real PostgreSQL: pruning must never delete a row that a
 * decision still reads as "this tick ran" — catch-up's look for holes, a late node's decision —
 * and a short retention must not flood the pool with prune passes.
 *
 * Prune passes run on `setInterval`: the tests fake that timer alone (the tick clock is a
 * SimulatedClock, the database answers in real time) and fire it when they choose; a pass is
 * known to be over when a row it must delete is gone.
 */
import { randomBytes } from 'node:crypto';
import { testDatabaseBaseUrl } from '@lockkit/test-db';
import pg from 'pg';
import { afterAll, afterEach, beforeAll, expect, it, vi } from 'vitest';
import { SimulatedClock } from '../src/clock.js';
import { createLockClient } from '../src/lock.js';
import { createScheduler, type Scheduler } from '../src/scheduler.js';
import { poolExecutor } from './client-executor.js';

const schema = `lockkit_retention_${randomBytes(4).toString('hex')}`;
let pool: pg.Pool;
let observer: pg.Client;

beforeAll(async () => {
  pool = new pg.Pool({ connectionString: testDatabaseBaseUrl(), max: 6 });
  observer = new pg.Client({ connectionString: testDatabaseBaseUrl() });
  await observer.connect();
  await createLockClient(poolExecutor(pool), { schema }).migrate();
  await observer.query(`CREATE TABLE "${schema}".done (job text, tick timestamptz)`);
});
afterEach(() => {
  vi.useRealTimers();
});
afterAll(async () => {
  await observer.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
  await observer.end();
  await pool.end();
});

const client = () => createLockClient(poolExecutor(pool), { schema, engineSelfTest: false });

/** Resolves once each tick asked for has ended on `scheduler` (ran, failed or found done). */
function endings(scheduler: Scheduler<pg.PoolClient>) {
  const waiting = new Map<number, () => void>();
  for (const type of ['ran', 'failed', 'skipped-done'] as const)
    scheduler.on(type, (e) => waiting.get(e.tick.getTime())?.());
  return (tick: number) => new Promise<void>((resolve) => waiting.set(tick, resolve));
}

/** Waits until `job`'s ledger row of `tick` is gone: the prune pass that had to delete it ran. */
async function prunedPast(job: string, tick: number): Promise<void> {
  const until = Date.now() + 20_000;
  for (;;) {
    const { rows } = await observer.query(
      `SELECT 1 FROM "${schema}".runs WHERE job = $1 AND tick = $2`,
      [job, new Date(tick)],
    );
    if (rows.length === 0) return;
    if (Date.now() > until) throw new Error(`no prune pass deleted ${job}'s row of ${tick}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** Ticks of `job` whose handler committed more than once. */
async function ranTwice(job: string): Promise<string[]> {
  const { rows } = await observer.query<{ tick: Date }>(
    `SELECT tick FROM "${schema}".done WHERE job = $1 GROUP BY tick HAVING count(*) > 1`,
    [job],
  );
  return rows.map((r) => r.tick.toISOString());
}

it.each([
  ['catch-up runs holes again', { withinMs: 600_000 }],
  ['catch-up skips holes', 'skip'],
] as const)(
  'a short retention never deletes a tick that ran after a tick still PENDING (%s): no tick runs twice, none is called missed',
  async (_name, catchUp) => {
    vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'] });
    const job = `catch-up-${randomBytes(3).toString('hex')}`;
    const T0 = Date.UTC(2020, 0, 1);
    const clock = new SimulatedClock(T0 - 1100);
    const scheduler = createScheduler(client(), { clock, retentionMs: 1000 });
    const ended = endings(scheduler);
    const missed: number[] = [];
    scheduler.on('missed', (e) => missed.push(...e.ticks.map((t) => t.getTime())));
    scheduler.register(
      job,
      '* * * * * *',
      async (run) => {
        // Tick 0's first attempt fails: its retry waits an hour, PENDING.
        if (run.tick.getTime() === T0 && run.attempt === 1) throw new Error('first attempt fails');
        await run.tx.query(`INSERT INTO "${schema}".done VALUES ($1, $2)`, [job, run.tick]);
      },
      { retries: 1, retryDelayMs: 3_600_000, catchUp },
    );
    await scheduler.start();
    const step = async (i: number) => {
      const done = ended(T0 + i * 1000);
      await clock.advanceTo(T0 + i * 1000);
      await done;
    };
    // Tick −1 runs (the row a prune pass must delete), tick 0 fails, ticks 1 to 10 run.
    for (let i = -1; i <= 10; i++) await step(i);
    vi.advanceTimersToNextTimer(); // the first prune pass (the heartbeat's timer is later)
    await prunedPast(job, T0 - 1000);
    for (let i = 11; i <= 13; i++) await step(i);
    await scheduler.stop({ timeoutMs: 5000 });
    expect({ ranTwice: await ranTwice(job), missed }).toEqual({ ranTwice: [], missed: [] });
  },
  30_000,
);

it("a short retention keeps a tick's row while a late node may still decide it: the late node finds it done", async () => {
  vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'] });
  const job = `late-${randomBytes(3).toString('hex')}`;
  // Ticks a few seconds old on the database's clock: within what a late node may still decide.
  const recent = Math.floor(Date.now() / 1000) * 1000 - 3000;
  const old = Date.UTC(2020, 0, 1);
  const handler = async (run: { tick: Date; tx: pg.PoolClient }) => {
    await run.tx.query(`INSERT INTO "${schema}".done VALUES ($1, $2)`, [job, run.tick]);
  };
  const early = createScheduler(client(), {
    clock: new SimulatedClock(recent + 1500),
    retentionMs: 1000,
  });
  early.register(job, '* * * * * *', handler);
  await early.start();
  // An old tick (the row a prune pass must delete), then two recent ones.
  await early.runTick(job, new Date(old));
  await early.runTick(job, new Date(recent));
  await early.runTick(job, new Date(recent + 1000));
  vi.advanceTimersToNextTimer(); // the first prune pass (the heartbeat's timer is later)
  await prunedPast(job, old);
  // A node whose clock is 1.5 s late (within the 2 s grace) now fires the older recent tick.
  const late = createScheduler(client(), { clock: new SimulatedClock(recent + 100) });
  late.register(job, '* * * * * *', handler);
  await late.runTick(job, new Date(recent));
  await early.stop({ timeoutMs: 5000 });
  await late.stop({ timeoutMs: 5000 });
  expect(await ranTwice(job)).toEqual([]);
});

it('a decision that comes later than its look-back finds a pruned tick done, not free: a stalled timer, or runTick of an old tick, does not run it again', async () => {
  vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'] });
  const job = `stalled-${randomBytes(3).toString('hex')}`;
  // Two ticks years old on the database's clock (far beyond any look-back), then a recent one.
  const old = Date.UTC(2020, 0, 1);
  const recent = Math.floor(Date.now() / 1000) * 1000 - 3000;
  const handler = async (run: { tick: Date; tx: pg.PoolClient }) => {
    await run.tx.query(`INSERT INTO "${schema}".done VALUES ($1, $2)`, [job, run.tick]);
  };
  const early = createScheduler(client(), {
    clock: new SimulatedClock(recent + 500),
    retentionMs: 1000,
  });
  early.register(job, '* * * * * *', handler);
  const earlyEnded = endings(early);
  await early.start();
  await early.runTick(job, new Date(old));
  await early.runTick(job, new Date(old + 1000));
  await early.runTick(job, new Date(recent));
  vi.advanceTimersToNextTimer(); // the first prune pass: both old rows go, the latest stays
  await prunedPast(job, old);
  await prunedPast(job, old + 1000);
  // An operator's runTick of a tick whose row was pruned.
  const found = earlyEnded(old);
  await early.runTick(job, new Date(old));
  await found;
  // A node stalled since 2020 (its clock that far behind): its timer fires the other old tick now.
  const clock = new SimulatedClock(old + 500);
  const stalled = createScheduler(client(), { clock });
  stalled.register(job, '* * * * * *', handler);
  const stalledEnded = endings(stalled);
  await stalled.start();
  const fired = stalledEnded(old + 1000);
  await clock.advanceTo(old + 1000);
  await fired;
  await early.stop({ timeoutMs: 5000 });
  await stalled.stop({ timeoutMs: 5000 });
  expect(await ranTwice(job)).toEqual([]);
});

it("a late decision about a pruned tick that finds the job busy is not queued behind the run holding it (overlap 'queue'): it is done, not run again", async () => {
  vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'] });
  const job = `held-${randomBytes(3).toString('hex')}`;
  const old = Date.UTC(2020, 0, 1);
  const recent = Math.floor(Date.now() / 1000) * 1000 - 3000;
  let release = () => {};
  const gate = new Promise<void>((resolve) => {
    release = resolve;
  });
  let holding = () => {};
  const held = new Promise<void>((resolve) => {
    holding = resolve;
  });
  const scheduler = createScheduler(client(), {
    clock: new SimulatedClock(recent + 1500),
    retentionMs: 1000,
  });
  scheduler.register(
    job,
    '* * * * * *',
    async (run) => {
      await run.tx.query(`INSERT INTO "${schema}".done VALUES ($1, $2)`, [job, run.tick]);
      // The latest tick's run holds the job until the test releases it.
      if (run.tick.getTime() === recent + 1000) {
        holding();
        await gate;
      }
    },
    { overlap: 'queue', claimTimeoutMs: 100 },
  );
  const ended = endings(scheduler);
  await scheduler.start();
  await scheduler.runTick(job, new Date(old));
  await scheduler.runTick(job, new Date(recent));
  vi.advanceTimersToNextTimer(); // the first prune pass: the old row goes
  await prunedPast(job, old);
  const holder = scheduler.runTick(job, new Date(recent + 1000));
  await held;
  // The old tick's decision waits for the job, times out, and finds another tick's run holding it.
  const found = ended(old);
  await scheduler.runTick(job, new Date(old));
  release();
  await holder;
  await found;
  await scheduler.stop({ timeoutMs: 5000 });
  expect(await ranTwice(job)).toEqual([]);
});

it('a tick older than what pruning keeps, with no row but rows before and after it, was not pruned: it runs (a transaction-mode run of it that outlasted the look-back and rolled back)', async () => {
  const job = `rolled-back-${randomBytes(3).toString('hex')}`;
  const old = Date.UTC(2020, 0, 1);
  const handler = async (run: { tick: Date; tx: pg.PoolClient }) => {
    await run.tx.query(`INSERT INTO "${schema}".done VALUES ($1, $2)`, [job, run.tick]);
  };
  const scheduler = createScheduler(client(), {
    clock: new SimulatedClock(old + 2500),
    retentionMs: 1000,
  });
  scheduler.register(job, '* * * * * *', handler);
  const ended = endings(scheduler);
  await scheduler.start();
  // The ticks around it ran; its own run left nothing (rolled back when its node died).
  await scheduler.runTick(job, new Date(old));
  await scheduler.runTick(job, new Date(old + 2000));
  const outcome = new Promise<string>((resolve) => {
    scheduler.on('ran', (e) => e.tick.getTime() === old + 1000 && resolve('ran'));
    scheduler.on('skipped-done', (e) => e.tick.getTime() === old + 1000 && resolve('skipped-done'));
  });
  const ending = ended(old + 1000);
  await scheduler.runTick(job, new Date(old + 1000));
  await ending;
  await scheduler.stop({ timeoutMs: 5000 });
  expect(await outcome).toBe('ran');
  const { rows } = await observer.query(
    `SELECT count(*)::int AS n FROM "${schema}".done WHERE job = $1 AND tick = $2`,
    [job, new Date(old + 1000)],
  );
  expect(rows[0]?.n).toBe(1);
});

it('a retention of 1 ms does not start a prune pass every half millisecond', async () => {
  const intervals: number[] = [];
  const real = globalThis.setInterval;
  const spy = vi.spyOn(globalThis, 'setInterval').mockImplementation(((
    fn: () => void,
    ms?: number,
  ) => {
    intervals.push(ms ?? 0);
    return real(fn, ms);
  }) as typeof setInterval);
  try {
    const scheduler = createScheduler(client(), { retentionMs: 1 });
    scheduler.register(`storm-${randomBytes(3).toString('hex')}`, '0 0 0 1 1 *', () => {});
    await scheduler.start();
    await scheduler.stop({ timeoutMs: 5000 });
  } finally {
    spy.mockRestore();
  }
  expect(intervals.length).toBeGreaterThan(0);
  expect(Math.min(...intervals)).toBeGreaterThanOrEqual(1000);
});
