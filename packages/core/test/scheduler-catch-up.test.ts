/**
 * Catch-up against a real PostgreSQL at the moments its look-back reaches: a tick whose run died
 * after many later ticks were decided must still be judged — run or recorded per the job's
 * catch-up policy — never left without a row.
 *
 * The tick clock is a SimulatedClock set by hand; the runs hold and die when the test says (a
 * gate, then `pg_terminate_backend`), so no case depends on how fast the machine is.
 */
import { randomBytes } from 'node:crypto';
import { testDatabaseBaseUrl } from '@lockkit/test-db';
import pg from 'pg';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { SimulatedClock } from '../src/clock.js';
import { CATCH_UP_WINDOW } from '../src/ledger.js';
import { createLockClient } from '../src/lock.js';
import { type CatchUpPolicy, createScheduler } from '../src/scheduler.js';
import { poolExecutor } from './client-executor.js';

const schema = `lockkit_catch_up_${randomBytes(4).toString('hex')}`;
let observer: pg.Client;
const pools: pg.Pool[] = [];

beforeAll(async () => {
  observer = new pg.Client({ connectionString: testDatabaseBaseUrl() });
  await observer.connect();
  await createLockClient(poolExecutor(newPool()), { schema }).migrate();
  await observer.query(`CREATE TABLE "${schema}".done (job text, tick timestamptz, node text)`);
});
afterAll(async () => {
  await observer.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
  await observer.end();
  await Promise.all(pools.map((p) => p.end()));
});

function newPool(): pg.Pool {
  const pool = new pg.Pool({ connectionString: testDatabaseBaseUrl(), max: 4 });
  // A terminated backend's idle client reports its end here; nothing to do but let it go.
  pool.on('error', () => {});
  // So does a checked-out one (the dying run's): its error is the death this test causes.
  pool.on('connect', (c) => c.on('error', () => {}));
  pools.push(pool);
  return pool;
}

/** Waits until the backend `pid` has exited (its locks are free then). */
async function backendGone(pid: number): Promise<void> {
  const until = Date.now() + 20_000;
  for (;;) {
    const { rows } = await observer.query('SELECT 1 FROM pg_stat_activity WHERE pid = $1', [pid]);
    if (rows.length === 0) return;
    if (Date.now() > until) throw new Error(`backend ${pid} still there`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** Waits (up to 10 s) until `job`'s tick has a settled ledger row. */
async function judged(job: string, tick: Date): Promise<void> {
  const until = Date.now() + 10_000;
  for (;;) {
    const { rows } = await observer.query(
      `SELECT 1 FROM "${schema}".runs WHERE job = $1 AND tick = $2 AND status NOT IN ('PENDING', 'RUNNING')`,
      [job, tick],
    );
    if (rows.length > 0 || Date.now() > until) return;
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** A promise and the function that settles it. */
function gate<T = void>() {
  let open!: (value: T) => void;
  const promise = new Promise<T>((resolve) => {
    open = resolve;
  });
  return { promise, open };
}

it.each([
  [
    'skip',
    'recorded SKIPPED_OVERLAP',
    'runs it',
    { withinMs: 3_600_000 },
    { status: 'SUCCEEDED', ran: ['b'] },
  ],
  ['skip', 'recorded SKIPPED_OVERLAP', 'records it MISSED', 'skip', { status: 'MISSED', ran: [] }],
  [
    'queue',
    'queued (and run once it died)',
    'runs it',
    { withinMs: 3_600_000 },
    { status: 'SUCCEEDED', ran: ['b'] },
  ],
  [
    'queue',
    'queued (and run once it died)',
    'records it MISSED',
    'skip',
    { status: 'MISSED', ran: [] },
  ],
] as const)(
  "overlap '%s': a tick whose transaction-mode run dies after more later ticks than catch-up anchors on were %s is judged by catch-up, which %s",
  async (overlap, _rows, _name, catchUp: CatchUpPolicy, expected) => {
    const job = `long-${randomBytes(3).toString('hex')}`;
    // Recent ticks: far younger than what pruning keeps, so that nothing here is taken for pruned.
    const T0 = Math.floor(Date.now() / 1000) * 1000 - 60_000;
    const at = (i: number) => new Date(T0 + i * 1000);
    const clock = new SimulatedClock(T0 - 1000);
    const client = () =>
      createLockClient(poolExecutor(newPool()), { schema, engineSelfTest: false });
    const started = gate<number>();
    const release = gate();
    const a = createScheduler(client(), { clock, owner: 'a' });
    a.register(
      job,
      '* * * * * *',
      async (run) => {
        if (run.mode !== 'transaction') throw new Error('mode');
        const [me] = await run.query('SELECT pg_backend_pid() AS pid');
        started.open(Number(me?.pid));
        await release.promise; // dies meanwhile: its backend is terminated
      },
      { overlap, catchUp },
    );
    const b = createScheduler(client(), { clock, owner: 'b' });
    const record = async (run: { tick: Date; tx: pg.PoolClient }) => {
      await run.tx.query(`INSERT INTO "${schema}".done VALUES ($1, $2, 'b')`, [job, run.tick]);
    };
    b.register(
      job,
      '* * * * * *',
      async (run) => record(run as { tick: Date; tx: pg.PoolClient }),
      {
        // Short: each tick B fires while A's run holds the job is judged an overlap at once.
        claimTimeoutMs: 50,
        catchUp,
        overlap,
      },
    );
    // Tick −1 runs: the job has a settled row for catch-up to start from.
    await b.runTick(job, at(-1));
    await clock.advanceTo(T0);
    const aRun = a.runTick(job, at(0));
    try {
      const pid = await started.promise;
      // More overlapping ticks than catch-up's window of latest rows: each recorded skipped, or
      // queued.
      const overlapping = CATCH_UP_WINDOW + 2;
      for (let i = 1; i <= overlapping; i++) {
        await clock.advanceTo(at(i).getTime());
        await b.runTick(job, at(i));
      }
      const skipped = await observer.query(
        `SELECT count(*)::int AS n FROM "${schema}".runs WHERE job = $1 AND status = $2`,
        [job, overlap === 'skip' ? 'SKIPPED_OVERLAP' : 'PENDING'],
      );
      expect(skipped.rows[0]?.n).toBe(overlapping);
      // A's run dies (its process, its connection): its transaction rolls back, tick 0 has no row.
      await observer.query('SELECT pg_terminate_backend($1)', [pid]);
      await backendGone(pid);
      // The next tick, decided past the grace: its catch-up must judge tick 0.
      const next = overlapping + 1;
      await clock.advanceTo(at(next).getTime() + 5000);
      await b.runTick(job, at(next));
      await judged(job, at(0));
      const { rows } = await observer.query<{ status: string }>(
        `SELECT status FROM "${schema}".runs WHERE job = $1 AND tick = $2`,
        [job, at(0)],
      );
      const ran = await observer.query<{ node: string }>(
        `SELECT node FROM "${schema}".done WHERE job = $1 AND tick = $2`,
        [job, at(0)],
      );
      expect({ status: rows[0]?.status ?? 'no row', ran: ran.rows.map((r) => r.node) }).toEqual(
        expected,
      );
    } finally {
      release.open();
      await aRun.catch(() => {});
      await Promise.all([a.stop({ timeoutMs: 5000 }), b.stop({ timeoutMs: 5000 })]);
    }
  },
  30_000,
);
