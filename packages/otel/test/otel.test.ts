/**
 * The OpenTelemetry integration read the way users read it: drive real lock operations, leases
 * (one of them lost) and a scheduler (runs, failures, skips, and database errors) against a real
 * Postgres, export through the SDK's in-memory metric and span exporters, and assert names,
 * values and attribute sets — metrics carry only bounded attributes, spans carry the keys.
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
import {
  AggregationTemporality,
  type DataPoint,
  InMemoryMetricExporter,
  MeterProvider,
  type MetricData,
  PeriodicExportingMetricReader,
} from '@opentelemetry/sdk-metrics';
import {
  BasicTracerProvider,
  InMemorySpanExporter,
  SimpleSpanProcessor,
} from '@opentelemetry/sdk-trace-base';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { lockkitTelemetry } from '../src/index.js';

let pool: pg.Pool;
let down: pg.Pool;
const schema = `lockkit_otel_${randomBytes(4).toString('hex')}`;
const spans = new InMemorySpanExporter();
const tracerProvider = new BasicTracerProvider({
  spanProcessors: [new SimpleSpanProcessor(spans)],
});
const metricExporter = new InMemoryMetricExporter(AggregationTemporality.CUMULATIVE);
const meterProvider = new MeterProvider({
  readers: [
    new PeriodicExportingMetricReader({ exporter: metricExporter, exportIntervalMillis: 60_000 }),
  ],
});

beforeAll(async () => {
  pool = new pg.Pool({ connectionString: testDatabaseUrl(), max: 6 });
  // A database that is down: nothing listens on port 1.
  down = new pg.Pool({ connectionString: 'postgres://postgres@127.0.0.1:1/none', max: 1 });
  down.on('error', () => {});
});
afterAll(async () => {
  await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
  await Promise.all([pool.end(), down.end(), meterProvider.shutdown()]);
});

/** Resolves once `scheduler` has reported each of `wanted` (type, job) at least once. */
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

/** The summed value of a counter's points whose attributes are exactly `attributes`. */
function counted(metric: MetricData | undefined, attributes: Record<string, string>): number {
  let total = 0;
  for (const point of (metric?.dataPoints ?? []) as DataPoint<number>[]) {
    const keys = Object.keys(point.attributes);
    if (
      keys.length === Object.keys(attributes).length &&
      keys.every((k) => point.attributes[k] === attributes[k])
    )
      total += point.value;
  }
  return total;
}

describe('lockkitTelemetry', () => {
  it('exports locks, leases (one lost) and scheduled runs, failures, skips and errors', async () => {
    const telemetry = lockkitTelemetry({
      tracer: tracerProvider.getTracer('test'),
      meter: meterProvider.getMeter('test'),
    });
    const locks = createLockClient(pgExecutor(pool), { onEvent: telemetry.onEvent, schema });
    const plain = createLockClient(pgExecutor(pool), { schema });
    await locks.migrate();

    // Locks: 2 committed on two different keys, 1 shared, 1 rolled back, 1 skipped, 1 timed out,
    // 1 session — a metric series per key would show up as extra points.
    const jobKey = `report-${randomBytes(3).toString('hex')}`;
    const key = LockKey.fromNames('otel', jobKey);
    await locks.runExclusiveJob('otel', jobKey, async () => 'ran');
    await locks.runExclusiveJob('otel', `${jobKey}-other`, async () => 'ran');
    await locks.withLock(key, async () => 3, { mode: 'shared' });
    await expect(
      locks.withLock(key, async () => {
        throw new Error('task failed');
      }),
    ).rejects.toThrow('task failed');
    await plain.withLock(key, async () => {
      expect((await locks.runExclusiveJob('otel', jobKey, async () => 'no')).executed).toBe(false);
      await expect(
        locks.withLock(key, async () => 'no', { wait: true, timeoutMs: 50 }),
      ).rejects.toBeInstanceOf(LockTimeoutError);
    });
    await locks.withSessionLock(key, async () => 6);

    // Leases: one finished, one lost (its token bumped under it; the next renewal finds it gone).
    const long = await locks.runWithLease('otel', 'long', async () => 'leased', {
      heartbeat: false,
    });
    await expect(
      locks.runWithLease(
        'otel',
        'stolen',
        async (lease) => {
          await pool.query(
            `UPDATE "${schema}".leases SET token = token + 1 WHERE namespace = 'otel' AND job_key = 'stolen'`,
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
    telemetry.observeScheduler(scheduler);
    telemetry.observeScheduler(outage);
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

    // Metrics, as the in-memory exporter received them.
    await meterProvider.forceFlush();
    const exported = metricExporter.getMetrics().at(-1);
    const metrics = new Map(
      (exported?.scopeMetrics ?? []).flatMap((s) => s.metrics).map((m) => [m.descriptor.name, m]),
    );
    expect([...metrics.keys()].sort()).toEqual([
      'lockkit.lease.events',
      'lockkit.lock.hold',
      'lockkit.lock.operations',
      'lockkit.lock.wait',
      'lockkit.scheduler.errors',
      'lockkit.scheduler.run.duration',
      'lockkit.scheduler.runs',
    ]);
    const ops = metrics.get('lockkit.lock.operations');
    const op = (outcome: string, scope: string, mode: string) =>
      counted(ops, { 'lockkit.outcome': outcome, 'lockkit.scope': scope, 'lockkit.mode': mode });
    expect(op('committed', 'transaction', 'exclusive')).toBe(4); // 2 + the 2 lease claims
    expect(op('committed', 'transaction', 'shared')).toBe(1);
    expect(op('rolled-back', 'transaction', 'exclusive')).toBe(1);
    expect(op('skipped', 'transaction', 'exclusive')).toBe(1);
    expect(op('timed-out', 'transaction', 'exclusive')).toBe(1);
    expect(op('committed', 'session', 'exclusive')).toBe(1);
    expect(ops?.dataPoints).toHaveLength(6); // one series per outcome, scope and mode: no keys
    const leases = metrics.get('lockkit.lease.events');
    expect(counted(leases, { 'lockkit.event': 'claimed' })).toBe(2);
    expect(counted(leases, { 'lockkit.event': 'finished' })).toBe(1);
    expect(counted(leases, { 'lockkit.event': 'lost' })).toBe(1);
    const runs = metrics.get('lockkit.scheduler.runs');
    expect(counted(runs, { 'lockkit.job': 'ok', 'lockkit.outcome': 'ran' })).toBeGreaterThan(0);
    expect(counted(runs, { 'lockkit.job': 'boom', 'lockkit.outcome': 'failed' })).toBeGreaterThan(
      0,
    );
    expect(
      counted(runs, { 'lockkit.job': 'held', 'lockkit.outcome': 'skipped-held' }),
    ).toBeGreaterThan(0);
    expect(
      counted(metrics.get('lockkit.scheduler.errors'), { 'lockkit.job': 'down' }),
    ).toBeGreaterThan(0);
    // Bounded attribute sets on every metric: never a key, a job key or a token.
    const attributesOf = (name: string) =>
      [
        ...new Set((metrics.get(name)?.dataPoints ?? []).flatMap((p) => Object.keys(p.attributes))),
      ].sort();
    expect(attributesOf('lockkit.lock.operations')).toEqual([
      'lockkit.mode',
      'lockkit.outcome',
      'lockkit.scope',
    ]);
    expect(attributesOf('lockkit.lock.wait')).toEqual(['lockkit.mode', 'lockkit.scope']);
    expect(attributesOf('lockkit.lock.hold')).toEqual(['lockkit.mode', 'lockkit.scope']);
    expect(attributesOf('lockkit.lease.events')).toEqual(['lockkit.event']);
    expect(attributesOf('lockkit.scheduler.runs')).toEqual(['lockkit.job', 'lockkit.outcome']);
    expect(attributesOf('lockkit.scheduler.run.duration')).toEqual(['lockkit.job']);
    expect(attributesOf('lockkit.scheduler.errors')).toEqual(['lockkit.job']);

    // Spans keep the detail.
    const finished = spans.getFinishedSpans();
    const lockSpans = finished.filter((s) => s.name === 'lockkit.lock');
    expect(lockSpans.map((s) => s.attributes['lockkit.outcome'])).toEqual(
      expect.arrayContaining(['committed', 'skipped', 'timed-out', 'rolled-back']),
    );
    const committed = lockSpans.find(
      (s) =>
        s.attributes['lockkit.outcome'] === 'committed' &&
        s.attributes['lockkit.job_key'] === jobKey,
    );
    expect(committed?.attributes).toMatchObject({
      'lockkit.namespace': 'otel',
      'lockkit.key': String(key.pair),
      'lockkit.scope': 'transaction',
      'lockkit.mode': 'exclusive',
    });
    expect(committed?.events.map((e) => e.name)).toContain('acquired');
    expect(
      lockSpans.find((s) => s.attributes['lockkit.outcome'] === 'timed-out')?.status.code,
    ).toBe(2); // ERROR
    const leaseSpans = finished.filter((s) => s.name === 'lockkit.lease');
    expect(
      leaseSpans.find((s) => s.attributes['lockkit.job_key'] === 'long')?.attributes,
    ).toMatchObject({
      'lockkit.namespace': 'otel',
      'lockkit.token': String(long.executed ? long.token : 'not run'),
    });
    expect(leaseSpans.find((s) => s.attributes['lockkit.job_key'] === 'stolen')?.status.code).toBe(
      2,
    );
    const jobSpans = finished.filter((s) => s.name === 'lockkit.job');
    expect(jobSpans.find((s) => s.attributes['lockkit.job'] === 'boom')?.status.code).toBe(2);
  }, 30_000);

  it('costs nothing when not enabled: a client without onEvent emits nothing', async () => {
    const before = spans.getFinishedSpans().length;
    await createLockClient(pgExecutor(pool)).runExclusiveJob('otel', 'quiet', async () => 1);
    expect(spans.getFinishedSpans().length).toBe(before);
  });
});
