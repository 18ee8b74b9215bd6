/**
 * The scheduler's life cycle against a real PostgreSQL, where a call could leave it half-stopped
 * or waiting for ever: stop() while start() waits (no timer may stay armed), stop()'s own
 * `timeoutMs` (refused when no timer can wait it), and runTick() from inside the handler of the
 * tick it asks for (refused at once: it would wait for the run that waits for it).
 */
import { randomBytes } from 'node:crypto';
import { testDatabaseBaseUrl } from '@lockkit/test-db';
import pg from 'pg';
import { afterAll, afterEach, beforeAll, expect, it, vi } from 'vitest';
import { SimulatedClock } from '../src/clock.js';
import { isLockkitError } from '../src/errors.js';
import { createLockClient } from '../src/lock.js';
import { createScheduler } from '../src/scheduler.js';
import { poolExecutor } from './client-executor.js';

const schema = `lockkit_lifecycle_${randomBytes(4).toString('hex')}`;
let pool: pg.Pool;
let observer: pg.Client;

beforeAll(async () => {
  pool = new pg.Pool({ connectionString: testDatabaseBaseUrl(), max: 6 });
  observer = new pg.Client({ connectionString: testDatabaseBaseUrl() });
  await observer.connect();
  await createLockClient(poolExecutor(pool), { schema }).migrate();
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

it('stop() while start() waits on the database leaves no timer armed', async () => {
  vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'] });
  const scheduler = createScheduler(client(), { retentionMs: 60_000 });
  scheduler.register(`start-stop-${randomBytes(3).toString('hex')}`, '0 0 0 1 1 *', () => {});
  const started = scheduler.start();
  const stopped = scheduler.stop({ timeoutMs: 5000 });
  await Promise.all([started, stopped]);
  expect(vi.getTimerCount()).toBe(0);
});

it.each([
  ['Infinity', Number.POSITIVE_INFINITY],
  ['2^31 ms', 2 ** 31],
  ['NaN', Number.NaN],
  ['-1', -1],
])(
  'stop({ timeoutMs: %s }) is refused with OPTION_INVALID, the scheduler left running',
  async (_name, timeoutMs) => {
    const scheduler = createScheduler(client());
    let release!: () => void;
    const gate = new Promise<void>((resolve) => {
      release = resolve;
    });
    const job = `stop-${randomBytes(3).toString('hex')}`;
    let started!: () => void;
    const running = new Promise<void>((resolve) => {
      started = resolve;
    });
    scheduler.register(job, '0 0 0 1 1 *', async () => {
      started();
      await gate;
    });
    const tick = scheduler.runTick(job, new Date(Date.UTC(2020, 0, 1)));
    await running;
    const refused = await scheduler.stop({ timeoutMs }).then(
      (r) => r,
      (e: unknown) => e,
    );
    expect(isLockkitError(refused) && refused.code).toBe('OPTION_INVALID');
    release();
    await tick;
    await expect(scheduler.stop({ timeoutMs: 5000 })).resolves.toEqual({ stillRunning: 0 });
  },
);

it('runTick() for the tick whose handler calls it is refused with NESTED_CALL; the run itself completes', async () => {
  const scheduler = createScheduler(client(), {
    clock: new SimulatedClock(Date.UTC(2030, 0, 1, 0, 0, 30)),
  });
  const job = `reentrant-${randomBytes(3).toString('hex')}`;
  const tick = new Date(Date.UTC(2030, 0, 1));
  let inner: unknown;
  const ran: number[] = [];
  scheduler.on('ran', (e) => ran.push(e.tick.getTime()));
  scheduler.register(
    job,
    '0 * * * * *',
    async (run) => {
      inner = await scheduler.runTick(job, run.tick).then(
        () => 'resolved',
        (e: unknown) => e,
      );
    },
    { claimTimeoutMs: 200 },
  );
  // Were the inner call to wait, the outer one would never settle: bounded here, not judged by time.
  const outer = await Promise.race([
    scheduler.runTick(job, tick).then(() => 'settled'),
    new Promise((resolve) => setTimeout(resolve, 20_000, 'still waiting after 20 s')),
  ]);
  await scheduler.stop({ timeoutMs: 5000 });
  expect({
    outer,
    inner: isLockkitError(inner) ? inner.code : inner,
    ran,
  }).toEqual({ outer: 'settled', inner: 'NESTED_CALL', ran: [tick.getTime()] });
});
