/**
 * `@lockkit/otel`: OpenTelemetry for lockkit — spans around lock operations, leases and scheduled
 * runs, counters and histograms — through `@opentelemetry/api` only, so you bring your own SDK.
 * Nothing is recorded unless you pass `onEvent` to a lock client or observe a scheduler.
 *
 * @example
 * ```ts
 * import { lockkitTelemetry } from '@lockkit/otel';
 * const telemetry = lockkitTelemetry();                       // global tracer and meter providers
 * const locks = createLockKit(pool, { onEvent: telemetry.onEvent });
 * telemetry.observeScheduler(createScheduler(locks));
 * ```
 *
 * @packageDocumentation
 */
import {
  type LockkitEvent,
  type LockkitEventListener,
  SCHEDULER_OUTCOMES,
  type Scheduler,
  type SchedulerEvent,
} from '@lockkit/core';
import {
  type Attributes,
  type Counter,
  type Histogram,
  type Meter,
  metrics,
  type Span,
  SpanStatusCode,
  type Tracer,
  trace,
} from '@opentelemetry/api';

/** Options of {@link lockkitTelemetry}. */
export interface LockkitTelemetryOptions {
  /** Default: `trace.getTracer('@lockkit/otel')`. */
  readonly tracer?: Tracer;
  /** Default: `metrics.getMeter('@lockkit/otel')`. */
  readonly meter?: Meter;
}

/** What {@link lockkitTelemetry} returns. */
export interface LockkitTelemetry {
  /** Pass as `onEvent` to `createLockKit(…)` / `createLockClient(…)`. */
  readonly onEvent: LockkitEventListener;
  /** Records a scheduler's runs; returns a function that stops observing. */
  observeScheduler(scheduler: Scheduler<unknown>): () => void;
}

interface Instruments {
  readonly operations: Counter;
  readonly wait: Histogram;
  readonly hold: Histogram;
  readonly leases: Counter;
  readonly runs: Counter;
  readonly runDuration: Histogram;
  readonly errors: Counter;
}

/** Span attributes of a lock: everything that tells which lock it was. */
function keyAttributes(event: Extract<LockkitEvent, { key: unknown }>): Attributes {
  const names = event.key.names;
  return {
    'lockkit.key': String(event.key.pair ?? event.key.int8),
    'lockkit.scope': event.scope,
    'lockkit.mode': event.mode,
    ...(names && { 'lockkit.namespace': names.namespace, 'lockkit.job_key': names.jobKey }),
  };
}

/** Metric attributes of a lock: bounded values only, so a series never exists per key. */
function lockMetricAttributes(event: Extract<LockkitEvent, { key: unknown }>): Attributes {
  return { 'lockkit.scope': event.scope, 'lockkit.mode': event.mode };
}

/** `lease-claimed` → `claimed`, as `@lockkit/prometheus` and the README name them. */
function leaseEventName(type: `lease-${string}`): string {
  return type.slice('lease-'.length);
}

/**
 * Spans and metrics for lockkit.
 *
 * Spans carry what identifies an operation: `lockkit.lock` per lock operation (attempt →
 * `acquired` event → end, with `lockkit.key`, `lockkit.namespace`, `lockkit.job_key`,
 * `lockkit.outcome`), `lockkit.lease` per held lease (with `lockkit.token`), `lockkit.job` per
 * scheduled run.
 *
 * Metrics carry bounded attributes only — outcome, scope, mode, lease event and scheduled job name
 * — never a key, a job key or a token (each would make a series per lock or per lease):
 * - counter `lockkit.lock.operations{lockkit.outcome, lockkit.scope, lockkit.mode}`;
 * - histograms `lockkit.lock.wait`, `lockkit.lock.hold` (ms) `{lockkit.scope, lockkit.mode}`;
 * - counter `lockkit.lease.events{lockkit.event}`: `claimed`, `renewed`, `lost`, `finished`;
 * - counter `lockkit.scheduler.runs{lockkit.job, lockkit.outcome}`, histogram
 *   `lockkit.scheduler.run.duration{lockkit.job}` (ms);
 * - counter `lockkit.scheduler.errors{lockkit.job}`: ticks the scheduler could not decide because
 *   the database failed.
 */
export function lockkitTelemetry(options: LockkitTelemetryOptions = {}): LockkitTelemetry {
  const tracer = options.tracer ?? trace.getTracer('@lockkit/otel');
  const meter = options.meter ?? metrics.getMeter('@lockkit/otel');
  const m: Instruments = {
    operations: meter.createCounter('lockkit.lock.operations', {
      description: 'Lock operations by outcome',
    }),
    wait: meter.createHistogram('lockkit.lock.wait', {
      unit: 'ms',
      description: 'Time from attempt to acquisition or skip',
    }),
    hold: meter.createHistogram('lockkit.lock.hold', {
      unit: 'ms',
      description: 'Time a lock was held',
    }),
    leases: meter.createCounter('lockkit.lease.events', {
      description: 'Lease claims, renewals, losses and ends',
    }),
    runs: meter.createCounter('lockkit.scheduler.runs', {
      description: 'Scheduled ticks by outcome',
    }),
    runDuration: meter.createHistogram('lockkit.scheduler.run.duration', {
      unit: 'ms',
      description: 'Duration of scheduled runs',
    }),
    errors: meter.createCounter('lockkit.scheduler.errors', {
      description: 'Scheduled ticks that could not be decided because the database failed',
    }),
  };
  const lockSpans = new Map<number, Span>();
  const leaseSpans = new Map<string, Span>();

  const endLock = (id: number, outcome: string, attributes: Attributes, error?: unknown) => {
    const span = lockSpans.get(id);
    lockSpans.delete(id);
    if (!span) return;
    span.setAttribute('lockkit.outcome', outcome);
    span.setAttributes(attributes);
    if (error !== undefined) span.setStatus({ code: SpanStatusCode.ERROR, message: String(error) });
    span.end();
  };

  const onEvent: LockkitEventListener = (event) => {
    switch (event.type) {
      case 'lock-attempt':
        lockSpans.set(
          event.id,
          tracer.startSpan('lockkit.lock', {
            attributes: { ...keyAttributes(event), 'lockkit.wait': event.wait },
          }),
        );
        return;
      case 'lock-acquired':
        m.wait.record(event.waitedMs, lockMetricAttributes(event));
        lockSpans.get(event.id)?.addEvent('acquired', { 'lockkit.waited_ms': event.waitedMs });
        return;
      case 'lock-skipped':
        m.operations.add(1, { ...lockMetricAttributes(event), 'lockkit.outcome': 'skipped' });
        m.wait.record(event.waitedMs, lockMetricAttributes(event));
        endLock(event.id, 'skipped', {});
        return;
      case 'lock-timed-out':
        m.operations.add(1, { ...lockMetricAttributes(event), 'lockkit.outcome': 'timed-out' });
        endLock(
          event.id,
          'timed-out',
          { 'lockkit.waited_ms': event.waitedMs },
          'lock wait timed out',
        );
        return;
      case 'lock-failed':
        m.operations.add(1, { ...lockMetricAttributes(event), 'lockkit.outcome': 'failed' });
        endLock(event.id, 'failed', {}, event.error);
        return;
      case 'lock-released':
        m.operations.add(1, { ...lockMetricAttributes(event), 'lockkit.outcome': event.outcome });
        m.hold.record(event.heldMs, lockMetricAttributes(event));
        endLock(
          event.id,
          event.outcome,
          { 'lockkit.held_ms': event.heldMs },
          event.outcome === 'committed' ? undefined : event.outcome,
        );
        return;
      default: {
        const id = `${event.namespace}/${event.jobKey}#${event.token}`;
        const attributes = {
          'lockkit.namespace': event.namespace,
          'lockkit.job_key': event.jobKey,
          'lockkit.token': String(event.token),
        };
        m.leases.add(1, { 'lockkit.event': leaseEventName(event.type) });
        if (event.type === 'lease-claimed') {
          leaseSpans.set(
            id,
            tracer.startSpan('lockkit.lease', {
              attributes: { ...attributes, 'lockkit.took_over': event.tookOver },
            }),
          );
        } else if (event.type === 'lease-renewed') {
          leaseSpans.get(id)?.addEvent('renewed');
        } else {
          const span = leaseSpans.get(id);
          leaseSpans.delete(id);
          if (!span) return;
          if (event.type === 'lease-lost')
            span.setStatus({ code: SpanStatusCode.ERROR, message: event.reason });
          else if (event.failed)
            span.setStatus({ code: SpanStatusCode.ERROR, message: 'task failed' });
          span.end();
        }
      }
    }
  };

  return {
    onEvent,
    observeScheduler(scheduler) {
      const listener = (event: SchedulerEvent) => {
        if (event.type === 'error') {
          m.errors.add(1, { 'lockkit.job': event.job });
          return;
        }
        const outcome = event.type;
        m.runs.add(event.type === 'missed' ? event.ticks.length : 1, {
          'lockkit.job': event.job,
          'lockkit.outcome': outcome,
        });
        if (event.type === 'ran' || event.type === 'failed') {
          const end = Date.now();
          const durationMs = event.type === 'ran' ? event.durationMs : 0;
          if (event.type === 'ran') m.runDuration.record(durationMs, { 'lockkit.job': event.job });
          const span = tracer.startSpan('lockkit.job', {
            startTime: new Date(end - durationMs),
            attributes: {
              'lockkit.job': event.job,
              'lockkit.tick': event.tick.toISOString(),
              'lockkit.attempt': event.attempt,
              'lockkit.outcome': outcome,
            },
          });
          if (event.type === 'failed')
            span.setStatus({ code: SpanStatusCode.ERROR, message: String(event.error) });
          span.end(new Date(end));
        }
      };
      const types = [...SCHEDULER_OUTCOMES, 'error'] as const;
      for (const type of types) scheduler.on(type, listener as never);
      return () => {
        for (const type of types) scheduler.off(type, listener as never);
      };
    },
  };
}
