/**
 * A node drains a job's PENDING ticks once at a time, however many of its runs ask it to. Each
 * run that ends asks for a drain; on a loaded machine runs end faster than a drain gets through
 * the job's lock, and a node that started a drain per run sent them all at the same oldest tick:
 * one ran it, the rest waited their turn on the job's lock only to find it done, and the queue
 * behind that tick was starved by its own node (`pnpm chaos --adapter prisma` under CPU
 * saturation: ticks held for catch-up were still PENDING a minute after the run).
 *
 * Deterministic: the test's executor holds every drain's first read (the PENDING lookup) until
 * the runs that ask for drains meanwhile have ended; the clock's timers never fire by themselves.
 */
import { randomBytes } from 'node:crypto';
import { testDatabaseBaseUrl } from '@lockkit/test-db';
import pg from 'pg';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { SimulatedClock } from '../src/clock.js';
import type { LockExecutor } from '../src/executor.js';
import { createLockClient } from '../src/lock.js';
import { createScheduler, type SchedulerEvent } from '../src/scheduler.js';
import { poolExecutor } from './client-executor.js';

const schema = `lockkit_drain_${randomBytes(4).toString('hex')}`;
let pool: pg.Pool;

beforeAll(async () => {
  pool = new pg.Pool({ connectionString: testDatabaseBaseUrl(), max: 8 });
});
afterAll(async () => {
  await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
  await pool.end();
});

/** The drain's lookup of the next PENDING tick (sql/scheduler.ts, nextPendingStatement). */
const isPendingLookup = (text: string) =>
  text.includes("status = 'PENDING'") && text.includes('DESC');

/**
 * `executor`, with every PENDING lookup held, once `arm()` was called, until `release()`; `held`
 * counts the lookups held. Each lookup after the release takes the next of `failures`, if any,
 * and fails with it instead of running.
 */
function holdingPendingLookups(executor: LockExecutor<pg.PoolClient, pg.PoolClient>) {
  let armed = false;
  let open: () => void = () => {};
  const gate = new Promise<void>((resolve) => {
    open = resolve;
  });
  const asked: (() => void)[] = [];
  const state = {
    held: 0,
    arm: () => {
      armed = true;
    },
    release: () => open(),
    failures: [] as Error[],
    /** Resolves once `n` lookups were asked. */
    until: (n: number) =>
      new Promise<void>((resolve) => {
        const check = () => (state.held >= n ? resolve() : asked.push(check));
        check();
      }),
  };
  const wrapped: LockExecutor<pg.PoolClient, pg.PoolClient> = {
    ...executor,
    transaction: (fn) =>
      executor.transaction((ctx) =>
        fn({
          ...ctx,
          query: async (text, params) => {
            if (armed && isPendingLookup(text)) {
              state.held++;
              for (const check of asked.splice(0)) check();
              await gate;
              const failure = state.failures.shift();
              if (failure !== undefined) throw failure;
            }
            return ctx.query(text, params);
          },
        }),
      ),
  };
  return { executor: wrapped, lookups: state };
}

it('runs a PENDING tick once on a node whose runs asked for drains while its drain waited — no attempt of that node finds it done', async () => {
  const BASE = Date.UTC(2026, 0, 1, 0, 0, 0);
  const { executor, lookups } = holdingPendingLookups(poolExecutor(pool));
  const locks = createLockClient(executor, { schema, engineSelfTest: false });
  await locks.migrate();
  let nowMs = BASE + 100;
  const scheduler = createScheduler(locks, {
    clock: new SimulatedClock(BASE),
    now: () => nowMs,
  });
  const events: SchedulerEvent[] = [];
  for (const type of ['ran', 'failed', 'skipped-done', 'error'] as const)
    scheduler.on(type, (event) => events.push(event));
  const p1 = new Date(BASE);
  scheduler.register(
    'drained',
    '* * * * * *',
    ({ tick }) => {
      if (tick.getTime() === p1.getTime() && !events.some((e) => e.type === 'failed'))
        throw new Error('first attempt fails: the tick waits PENDING for its retry');
    },
    { retries: 1, retryDelayMs: 1000 },
  );
  await scheduler.start();
  try {
    // p1 fails once and waits PENDING for its retry, due at BASE + 1100 (the retry's own timer is
    // on the simulated clock and never fires: only drains run it).
    await scheduler.runTick('drained', p1);
    expect(events.map((e) => e.type)).toEqual(['failed']);
    nowMs = BASE + 5000;
    lookups.arm();
    // Three later ticks run, one after another; each asks for a drain when it ends, while the first
    // drain's lookup is held.
    const runs: Promise<void>[] = [];
    for (let s = 1; s <= 3; s++) {
      const tick = new Date(BASE + s * 1000);
      runs.push(scheduler.runTick('drained', tick));
      await new Promise<void>((resolve) => {
        const seen = () =>
          events.some((e) => e.type === 'ran' && e.tick.getTime() === tick.getTime());
        const look = () => (seen() ? resolve() : setImmediate(look));
        look();
      });
      // The run's drain is asked for synchronously after its 'ran' event: flush to it.
      await new Promise((r) => setImmediate(r));
    }
    await lookups.until(1);
    lookups.release();
    await Promise.all(runs);
    const atP1 = events.filter((e) => 'tick' in e && e.tick.getTime() === p1.getTime());
    expect(atP1.map((e) => e.type)).toEqual(['failed', 'ran']);
    expect(events.filter((e) => e.type === 'error')).toEqual([]);
    const { rows } = await pool.query(
      `SELECT status, attempt FROM "${schema}".runs WHERE job = 'drained' AND tick = $1`,
      [p1],
    );
    expect(rows).toEqual([{ status: 'SUCCEEDED', attempt: 2 }]);
  } finally {
    lookups.release();
    await scheduler.stop({ timeoutMs: 5000 });
  }
});

it('reports every failed drain pass, each with the tick of the run that asked for it — a drain joined while one runs is not silenced', async () => {
  const BASE = Date.UTC(2026, 0, 2, 0, 0, 0);
  const { executor, lookups } = holdingPendingLookups(poolExecutor(pool));
  const locks = createLockClient(executor, { schema, engineSelfTest: false });
  await locks.migrate();
  const scheduler = createScheduler(locks, {
    clock: new SimulatedClock(BASE),
    now: () => BASE + 5000,
  });
  const events: SchedulerEvent[] = [];
  for (const type of ['ran', 'error'] as const) scheduler.on(type, (event) => events.push(event));
  scheduler.register('reported', '* * * * * *', () => {});
  await scheduler.start();
  try {
    lookups.failures.push(new Error('boom-1'), new Error('boom-2'));
    lookups.arm();
    const t1 = new Date(BASE + 1000);
    const t2 = new Date(BASE + 2000);
    // t1 runs and its drain's lookup is held; t2 runs meanwhile and asks for a drain too.
    const first = scheduler.runTick('reported', t1);
    await lookups.until(1);
    const second = scheduler.runTick('reported', t2);
    await new Promise<void>((resolve) => {
      const look = () =>
        events.some((e) => e.type === 'ran' && e.tick.getTime() === t2.getTime())
          ? resolve()
          : setImmediate(look);
      look();
    });
    await new Promise((r) => setImmediate(r));
    // The held lookup fails (boom-1); the pass t2 asked for then runs, and its lookup fails too.
    lookups.release();
    await Promise.all([first, second]);
    const errors = events.flatMap((e) =>
      e.type === 'error' ? [[(e.error as Error).message, e.tick.getTime()]] : [],
    );
    expect(errors).toEqual([
      ['boom-1', t1.getTime()],
      ['boom-2', t2.getTime()],
    ]);
    expect(lookups.held).toBe(2);
  } finally {
    lookups.release();
    await scheduler.stop({ timeoutMs: 5000 });
  }
});
