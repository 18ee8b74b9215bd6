/**
 * start() registers every job's schedule in the ledger (the schedules table: conflicts, doctor)
 * in a few transactions, not one per job: 10,000 jobs made 10,000 transactions at start, whose
 * garbage alone grew V8's young generation and the resident set by ~10 MB (`pnpm bench
 * --memory`), and took seconds. What it reports must stay the same: a `schedule-conflict` for a
 * job that another live instance registered under another schedule, and for no other job.
 */
import { randomBytes } from 'node:crypto';
import { testDatabaseBaseUrl } from '@lockkit/test-db';
import pg from 'pg';
import { afterAll, beforeAll, expect, it } from 'vitest';
import type { LockExecutor } from '../src/executor.js';
import { createLockClient } from '../src/lock.js';
import { createScheduler, type SchedulerEvent } from '../src/scheduler.js';
import { poolExecutor } from './client-executor.js';

const schema = `lockkit_announce_${randomBytes(4).toString('hex')}`;
let pool: pg.Pool;

beforeAll(async () => {
  pool = new pg.Pool({ connectionString: testDatabaseBaseUrl(), max: 4 });
});
afterAll(async () => {
  await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
  await pool.end();
});

/** The pool's executor, counting the transactions it opens. */
function counted(): {
  executor: LockExecutor<pg.PoolClient, pg.PoolClient>;
  transactions(): number;
} {
  const inner = poolExecutor(pool);
  let transactions = 0;
  return {
    executor: {
      ...inner,
      transaction(fn) {
        transactions++;
        return inner.transaction(fn);
      },
    },
    transactions: () => transactions,
  };
}

it('start() registers 2,500 jobs in a few transactions, and reports the one conflicting job', async () => {
  const first = counted();
  const locks = createLockClient(first.executor, { schema });
  await locks.migrate();
  const one = createScheduler(locks, { owner: 'one' });
  for (let j = 0; j < 2500; j++) one.register(`job-${j}`, `${j % 60} ${j % 7} * * * *`, () => {});
  const before = first.transactions();
  await one.start();
  // One a job before; now one per batch of jobs.
  expect(first.transactions() - before).toBeLessThanOrEqual(5);
  const rows = await pool.query(
    `SELECT count(*)::int AS n FROM "${schema}".schedules WHERE owner = 'one'`,
  );
  expect(rows.rows).toEqual([{ n: 2500 }]);

  // A second instance: the same schedules but for one job, and one job the first does not have.
  const second = counted();
  const two = createScheduler(createLockClient(second.executor, { schema }), { owner: 'two' });
  const conflicts: SchedulerEvent[] = [];
  two.on('schedule-conflict', (e) => conflicts.push(e));
  for (let j = 0; j < 2500; j++) {
    const cron = j === 1234 ? '30 30 3 * * *' : `${j % 60} ${j % 7} * * * *`;
    two.register(`job-${j}`, cron, () => {});
  }
  two.register('only-two', '0 0 * * * *', () => {});
  await two.start();
  expect(second.transactions()).toBeLessThanOrEqual(5);
  expect(conflicts).toEqual([
    {
      type: 'schedule-conflict',
      job: 'job-1234',
      schedules: [
        { owner: 'one', cron: '34 2 * * * *', timezone: 'UTC' },
        { owner: 'two', cron: '30 30 3 * * *', timezone: 'UTC' },
      ],
    },
  ]);
  await Promise.all([one.stop({ timeoutMs: 5000 }), two.stop({ timeoutMs: 5000 })]);
});
