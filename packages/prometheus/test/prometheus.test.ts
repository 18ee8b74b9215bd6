/**
 * The Prometheus integration read the way users read it: drive real lock operations, leases
 * (one of them lost) and a scheduler (runs, failures, skips, and database errors) against a real
 * Postgres, then read the prom-client registry and assert metric names, label sets and values.
 */
import { randomBytes } from 'node:crypto';
import {
  createLockClient,
  createScheduler,
  LockKey,
  LockTimeoutError,
  type Scheduler,
  type SchedulerEventType,
} from '@lockkit/core';
import { pgExecutor } from '@lockkit/pg';
import { testDatabaseUrl } from '@lockkit/test-db';
import pg from 'pg';
import { Registry } from 'prom-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { lockkitPrometheus } from '../src/index.js';

let pool: pg.Pool;
let down: pg.Pool;
const schema = `lockkit_prom_${randomBytes(4).toString('hex')}`;
beforeAll(async () => {
  pool = new pg.Pool({ connectionString: testDatabaseUrl(), max: 6 });
  // A database that is down: nothing listens on port 1.
  down = new pg.Pool({ connectionString: 'postgres://postgres@127.0.0.1:1/none', max: 1 });
  down.on('error', () => {});
});
afterAll(async () => {
  await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
  await Promise.all([pool.end(), down.end()]);
});

/** Resolves once `scheduler` has reported each of `types` for `job` at least once. */
function sawAll(scheduler: Scheduler<unknown>, wanted: [SchedulerEventType, string][]) {
  return Promise.all(
    wanted.map(
      ([type, job]) =>
        new Promise<void>((resolve) => {
          const listener = (event: { job: string }) => {
            if (event.job !== job) return;
            scheduler.off(type, listener as never);
            resolve();
          };
          scheduler.on(type, listener as never);
        }),
    ),
  );
}

interface Metric {
  readonly name: string;
  readonly values: {
    readonly metricName?: string;
    readonly labels: Record<string, string | number>;
    readonly value: number;
  }[];
}
const sample = (metric: Metric | undefined, labels: Record<string, string>) =>
  metric?.values.find(
    (v) =>
      Object.keys(v.labels).length === Object.keys(labels).length &&
      Object.entries(labels).every(([k, l]) => v.labels[k] === l),
  )?.value;

describe('lockkitPrometheus', () => {
  it('counts locks, leases (one lost) and scheduled runs, failures, skips and errors', async () => {
    const registry = new Registry();
    const metrics = lockkitPrometheus({ registry });
    const locks = createLockClient(pgExecutor(pool), { onEvent: metrics.onEvent, schema });
    const plain = createLockClient(pgExecutor(pool), { schema });
    await locks.migrate();

    // Locks: 2 committed, 1 shared, 1 rolled back, 1 skipped, 1 timed out, 1 session.
    const key = LockKey.fromNames('prom', `job-${randomBytes(3).toString('hex')}`);
    await locks.withLock(key, async () => 1);
    await locks.withLock(key, async () => 2);
    await locks.withLock(key, async () => 3, { mode: 'shared' });
    await expect(
      locks.withLock(key, async () => {
        throw new Error('task failed');
      }),
    ).rejects.toThrow('task failed');
    await plain.withLock(key, async () => {
      expect((await locks.withLock(key, async () => 4)).executed).toBe(false);
      await expect(
        locks.withLock(key, async () => 5, { wait: true, timeoutMs: 50 }),
      ).rejects.toBeInstanceOf(LockTimeoutError);
    });
    await locks.withSessionLock(key, async () => 6);

    // Leases: one finished, one lost (its token bumped under it; the next renewal finds it gone).
    await locks.runWithLease('prom', 'report', async () => 'ok', { heartbeat: false });
    await expect(
      locks.runWithLease(
        'prom',
        'stolen',
        async (lease) => {
          await pool.query(
            `UPDATE "${schema}".leases SET token = token + 1 WHERE namespace = 'prom' AND job_key = 'stolen'`,
          );
          await new Promise((resolve) => lease.signal.addEventListener('abort', resolve));
        },
        { renewEveryMs: 50 },
      ),
    ).rejects.toMatchObject({ code: 'LEASE_LOST' });

    // The scheduler: a job that runs, one that fails, one whose lock another node holds, and
    // one whose database is down. Its own lock calls are not observed (no onEvent).
    const scheduler = createScheduler(plain);
    scheduler
      .register('ok', '* * * * * *', async () => {})
      .register('boom', '* * * * * *', async () => {
        throw new Error('job failed');
      })
      .register('held', '* * * * * *', async () => {}, { claimTimeoutMs: 100 });
    const outage = createScheduler(createLockClient(pgExecutor(down), { schema }));
    outage.register('down', '* * * * * *', async () => {});
    metrics.observeScheduler(scheduler);
    metrics.observeScheduler(outage);
    const seen = Promise.all([
      sawAll(scheduler, [
        ['ran', 'ok'],
        ['failed', 'boom'],
        ['skipped-held', 'held'],
      ]),
      sawAll(outage, [['error', 'down']]),
    ]);
    // Another node runs an earlier tick of 'held' until released: this node's ticks overlap it.
    // (A bare hold of the job's lock is not proof of an overlap: the scheduler waits again.)
    let release = () => {};
    const released = new Promise<void>((resolve) => {
      release = resolve;
    });
    let started = () => {};
    const running = new Promise<void>((resolve) => {
      started = resolve;
    });
    const other = createScheduler(plain, { owner: 'other-node' });
    other.register('held', '* * * * * *', async () => {
      started();
      await released;
    });
    const earlier = other.runTick('held', new Date(Math.floor(Date.now() / 1000) * 1000 - 1000));
    await running;
    try {
      await scheduler.start();
      await outage.start();
      await sawAll(scheduler, [['skipped-held', 'held']]);
    } finally {
      release();
      await earlier;
      await other.stop();
    }
    await seen;
    await Promise.all([scheduler.stop(), outage.stop()]);

    const all = (await registry.getMetricsAsJSON()) as unknown as Metric[];
    const byName = new Map(all.map((m) => [m.name, m]));
    expect([...byName.keys()].sort()).toEqual([
      'lockkit_lease_events_total',
      'lockkit_lock_hold_seconds',
      'lockkit_lock_operations_total',
      'lockkit_lock_wait_seconds',
      'lockkit_scheduler_errors_total',
      'lockkit_scheduler_run_seconds',
      'lockkit_scheduler_runs_total',
    ]);
    const ops = byName.get('lockkit_lock_operations_total');
    const op = (outcome: string, scope: string, mode: string) =>
      sample(ops, { outcome, scope, mode });
    expect(op('committed', 'transaction', 'exclusive')).toBe(4); // 2 + the 2 lease claims
    expect(op('committed', 'transaction', 'shared')).toBe(1);
    expect(op('rolled-back', 'transaction', 'exclusive')).toBe(1);
    expect(op('skipped', 'transaction', 'exclusive')).toBe(1);
    expect(op('timed-out', 'transaction', 'exclusive')).toBe(1);
    expect(op('committed', 'session', 'exclusive')).toBe(1);
    const leases = byName.get('lockkit_lease_events_total');
    expect(sample(leases, { event: 'claimed' })).toBe(2);
    expect(sample(leases, { event: 'finished' })).toBe(1);
    expect(sample(leases, { event: 'lost' })).toBe(1);
    const runs = byName.get('lockkit_scheduler_runs_total');
    expect(sample(runs, { job: 'ok', outcome: 'ran' })).toBeGreaterThanOrEqual(1);
    expect(sample(runs, { job: 'boom', outcome: 'failed' })).toBeGreaterThanOrEqual(1);
    expect(sample(runs, { job: 'held', outcome: 'skipped-held' })).toBeGreaterThanOrEqual(1);
    expect(
      sample(byName.get('lockkit_scheduler_errors_total'), { job: 'down' }),
    ).toBeGreaterThanOrEqual(1);
    expect(
      byName
        .get('lockkit_scheduler_run_seconds')
        ?.values.find(
          (v) => v.metricName === 'lockkit_scheduler_run_seconds_count' && v.labels.job === 'ok',
        )?.value,
    ).toBeGreaterThanOrEqual(1);
    // Bounded label sets: never a key, a job key or a token.
    const labelsOf = (name: string) =>
      [
        ...new Set(
          (byName.get(name)?.values ?? []).flatMap((v) =>
            Object.keys(v.labels).filter((l) => l !== 'le'),
          ),
        ),
      ].sort();
    expect(labelsOf('lockkit_lock_operations_total')).toEqual(['mode', 'outcome', 'scope']);
    expect(labelsOf('lockkit_lock_wait_seconds')).toEqual(['mode', 'scope']);
    expect(labelsOf('lockkit_lock_hold_seconds')).toEqual(['mode', 'scope']);
    expect(labelsOf('lockkit_lease_events_total')).toEqual(['event']);
    expect(labelsOf('lockkit_scheduler_runs_total')).toEqual(['job', 'outcome']);
    expect(labelsOf('lockkit_scheduler_run_seconds')).toEqual(['job']);
    expect(labelsOf('lockkit_scheduler_errors_total')).toEqual(['job']);
    // The exposition text carries the same.
    const text = await registry.metrics();
    expect(text).toContain('lockkit_lease_events_total{event="lost"} 1');
    expect(text).toMatch(/lockkit_scheduler_errors_total\{job="down"\} [1-9]/);
  }, 30_000);
});
