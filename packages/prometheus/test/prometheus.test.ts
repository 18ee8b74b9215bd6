/**
 * The Prometheus integration against real locks: the exposition text counts runs, skips and
 * timeouts, and histograms observe waits and holds.
 */
import { createLockClient, LockKey, LockTimeoutError } from '@lockkit/core';
import { pgExecutor } from '@lockkit/pg';
import { testDatabaseUrl } from '@lockkit/test-db';
import pg from 'pg';
import { Registry } from 'prom-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { lockkitPrometheus } from '../src/index.js';

let pool: pg.Pool;
beforeAll(() => {
  pool = new pg.Pool({ connectionString: testDatabaseUrl(), max: 3 });
});
afterAll(async () => {
  await pool.end();
});

describe('lockkitPrometheus', () => {
  it('exposes lock outcomes, waits and holds', async () => {
    const registry = new Registry();
    const metrics = lockkitPrometheus({ registry });
    const locks = createLockClient(pgExecutor(pool), { onEvent: metrics.onEvent });
    const plain = createLockClient(pgExecutor(pool));
    const key = LockKey.fromNames('prom', `job-${Math.random()}`);
    await locks.withLock(key, async () => 1);
    await locks.withLock(key, async () => 2);
    await plain.withLock(key, async () => {
      expect((await locks.withLock(key, async () => 3)).executed).toBe(false);
      await expect(
        locks.withLock(key, async () => 4, { wait: true, timeoutMs: 50 }),
      ).rejects.toBeInstanceOf(LockTimeoutError);
    });
    const text = await registry.metrics();
    expect(text).toContain(
      'lockkit_lock_operations_total{outcome="committed",scope="transaction"} 2',
    );
    expect(text).toContain(
      'lockkit_lock_operations_total{outcome="skipped",scope="transaction"} 1',
    );
    expect(text).toContain(
      'lockkit_lock_operations_total{outcome="timed-out",scope="transaction"} 1',
    );
    expect(text).toMatch(/lockkit_lock_hold_seconds_count\{scope="transaction"\} 2/);
    expect(text).toMatch(/lockkit_lock_wait_seconds_count\{scope="transaction"\} 3/);
  });
});
