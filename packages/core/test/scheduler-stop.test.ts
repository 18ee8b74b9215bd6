/**
 * Scheduler.stop() is bounded by its `timeoutMs` as a whole: when the database stops answering,
 * its clean-up (deleting this node's schedule registrations) must not hold it past that time.
 * The "stopped answering" is made deterministic: another transaction holds the schedules table
 * locked, so the clean-up's DELETE waits until that transaction ends — after stop() resolved.
 */
import { randomBytes } from 'node:crypto';
import { testDatabaseBaseUrl } from '@lockkit/test-db';
import pg from 'pg';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { createLockClient } from '../src/lock.js';
import { createScheduler } from '../src/scheduler.js';
import { poolExecutor } from './client-executor.js';

const schema = `lockkit_stop_${randomBytes(4).toString('hex')}`;
let pool: pg.Pool;
let blocker: pg.Client;

beforeAll(async () => {
  pool = new pg.Pool({ connectionString: testDatabaseBaseUrl(), max: 2 });
  blocker = new pg.Client({ connectionString: testDatabaseBaseUrl() });
  await blocker.connect();
});
afterAll(async () => {
  await blocker.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
  await blocker.end();
  await pool.end();
});

it('resolves within timeoutMs while its clean-up query cannot get an answer', async () => {
  const locks = createLockClient(poolExecutor(pool), { schema });
  await locks.migrate();
  const scheduler = createScheduler(locks);
  scheduler.register('far-away', '0 0 0 1 1 *', () => {});
  await scheduler.start();
  const registered = await blocker.query(`SELECT count(*)::int AS n FROM "${schema}".schedules`);
  expect(registered.rows).toEqual([{ n: 1 }]);
  await blocker.query('BEGIN');
  await blocker.query(`LOCK TABLE "${schema}".schedules IN ACCESS EXCLUSIVE MODE`);
  try {
    // Were the clean-up unbounded, this would wait for the ROLLBACK below, which comes after.
    await expect(scheduler.stop({ timeoutMs: 100 })).resolves.toEqual({ stillRunning: 0 });
  } finally {
    await blocker.query('ROLLBACK');
  }
});
