/**
 * A lease whose renewals are due at the longest interval runWithLease accepts — half of
 * ttlMs − safetyMarginMs — is kept past its first local deadline by a healthy database and ends
 * COMPLETED. The task ends on what happened (two renewals answered, or the lease lost), never on
 * a timer of the test's own.
 */
import { randomBytes } from 'node:crypto';
import { testDatabaseBaseUrl } from '@lockkit/test-db';
import pg from 'pg';
import { afterAll, beforeAll, expect, it } from 'vitest';
import type { LockkitEvent } from '../src/events.js';
import { createLockClient } from '../src/lock.js';
import { poolExecutor } from './client-executor.js';

const schema = `lockkit_renew_${randomBytes(4).toString('hex')}`;
let pool: pg.Pool;

beforeAll(() => {
  pool = new pg.Pool({ connectionString: testDatabaseBaseUrl(), max: 2 });
});
afterAll(async () => {
  await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
  await pool.end();
});

it('keeps a lease renewed every (ttlMs − safetyMarginMs) / 2 past its first deadline', async () => {
  let renewals = 0;
  let renewedTwice!: () => void;
  const twice = new Promise<void>((resolve) => {
    renewedTwice = resolve;
  });
  const onEvent = (event: LockkitEvent) => {
    if (event.type === 'lease-renewed' && ++renewals === 2) renewedTwice();
  };
  const locks = createLockClient(poolExecutor(pool), { schema, onEvent });
  await locks.migrate();
  // ttl 4000, margin 800: the first local deadline is 3.2 s after the claim was sent; the second
  // renewal is sent at about 3.2 s, so the lease outlives that deadline only by renewing. Each
  // renewal has 1.6 s to be answered (a busy CI machine's round trip, not the bound, is what a
  // shorter TTL would test).
  const settings = { ttlMs: 4000, safetyMarginMs: 800, renewEveryMs: 1600 };
  const result = await locks.runWithLease(
    'renew-bound',
    'job',
    async (lease) => {
      const lost = new Promise<void>((resolve) =>
        lease.signal.addEventListener('abort', () => resolve(), { once: true }),
      );
      await Promise.race([twice, lost]);
      return lease.signal.aborted ? 'lost' : 'done';
    },
    settings,
  );
  expect(result).toMatchObject({ executed: true, result: 'done' });
  expect(renewals).toBeGreaterThanOrEqual(2);
  const { rows } = await pool.query(`SELECT status FROM "${schema}".leases`);
  expect(rows).toEqual([{ status: 'COMPLETED' }]);
});
