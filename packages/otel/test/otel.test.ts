/**
 * The OpenTelemetry integration against real locks on a real Postgres, exported to in-memory
 * exporters: spans for run, skip and timeout, a lease span, and the counters and histograms.
 */
import { createLockClient, LockKey, LockTimeoutError } from '@lockkit/core';
import { pgExecutor } from '@lockkit/pg';
import { testDatabaseUrl } from '@lockkit/test-db';
import { MeterProvider, MetricReader } from '@opentelemetry/sdk-metrics';
import {
  BasicTracerProvider,
  InMemorySpanExporter,
  SimpleSpanProcessor,
} from '@opentelemetry/sdk-trace-base';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { lockkitTelemetry } from '../src/index.js';

class TestReader extends MetricReader {
  protected async onForceFlush(): Promise<void> {}
  protected async onShutdown(): Promise<void> {}
}

let pool: pg.Pool;
const spans = new InMemorySpanExporter();
const tracerProvider = new BasicTracerProvider({
  spanProcessors: [new SimpleSpanProcessor(spans)],
});
const reader = new TestReader();
const meterProvider = new MeterProvider({ readers: [reader] });
const schema = `lockkit_otel_${Math.random().toString(36).slice(2, 8)}`;

beforeAll(() => {
  pool = new pg.Pool({ connectionString: testDatabaseUrl(), max: 4 });
});
afterAll(async () => {
  await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
  await pool.end();
});

describe('lockkitTelemetry', () => {
  it('records spans and metrics for runs, skips, timeouts and leases', async () => {
    const telemetry = lockkitTelemetry({
      tracer: tracerProvider.getTracer('test'),
      meter: meterProvider.getMeter('test'),
    });
    const locks = createLockClient(pgExecutor(pool), { onEvent: telemetry.onEvent, schema });
    const plain = createLockClient(pgExecutor(pool));
    const key = LockKey.fromNames('otel', 'report');

    await locks.runExclusiveJob('otel', 'report', async () => 'ran');
    await plain.withLock(key, async () => {
      expect((await locks.runExclusiveJob('otel', 'report', async () => 'no')).executed).toBe(
        false,
      );
      await expect(
        locks.withLock(key, async () => 'no', { wait: true, timeoutMs: 50 }),
      ).rejects.toBeInstanceOf(LockTimeoutError);
    });
    await locks.migrate();
    await locks.runWithLease('otel', 'long', async () => 'leased', { heartbeat: false });

    const finished = spans.getFinishedSpans();
    const lockSpans = finished.filter((s) => s.name === 'lockkit.lock');
    expect(lockSpans.map((s) => s.attributes['lockkit.outcome'])).toEqual(
      expect.arrayContaining(['committed', 'skipped', 'timed-out']),
    );
    const committed = lockSpans.find((s) => s.attributes['lockkit.outcome'] === 'committed');
    expect(committed?.attributes).toMatchObject({
      'lockkit.namespace': 'otel',
      'lockkit.job_key': 'report',
      'lockkit.scope': 'transaction',
    });
    expect(committed?.events.map((e) => e.name)).toContain('acquired');
    expect(
      lockSpans.find((s) => s.attributes['lockkit.outcome'] === 'timed-out')?.status.code,
    ).toBe(2); // ERROR
    const lease = finished.find((s) => s.name === 'lockkit.lease');
    expect(lease?.attributes).toMatchObject({
      'lockkit.namespace': 'otel',
      'lockkit.job_key': 'long',
      'lockkit.token': '1',
    });

    const { resourceMetrics } = await reader.collect();
    const metrics = new Map(
      resourceMetrics.scopeMetrics.flatMap((s) => s.metrics).map((m) => [m.descriptor.name, m]),
    );
    const operations = metrics.get('lockkit.lock.operations');
    const byOutcome: Record<string, number> = {};
    for (const point of operations?.dataPoints ?? []) {
      const outcome = point.attributes['lockkit.outcome'] as string;
      byOutcome[outcome] = (byOutcome[outcome] ?? 0) + (point.value as number);
    }
    expect(byOutcome).toMatchObject({ committed: 2, skipped: 1, 'timed-out': 1 }); // the lease claim is a committed lock too
    expect(metrics.get('lockkit.lock.hold')?.dataPoints.length).toBeGreaterThan(0);
    expect(
      metrics.get('lockkit.lease.events')?.dataPoints.map((p) => p.attributes['lockkit.event']),
    ).toEqual(expect.arrayContaining(['lease-claimed', 'lease-finished']));
  });

  it('costs nothing when not enabled: a client without onEvent emits nothing', async () => {
    const before = spans.getFinishedSpans().length;
    await createLockClient(pgExecutor(pool)).runExclusiveJob('otel', 'quiet', async () => 1);
    expect(spans.getFinishedSpans().length).toBe(before);
  });
});
