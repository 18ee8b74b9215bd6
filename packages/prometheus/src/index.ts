/**
 * `@lockkit/prometheus`: lockkit's lock, lease and scheduler outcomes as Prometheus metrics, through
 * prom-client. Nothing is recorded unless you pass `onEvent` to a lock client or observe a scheduler.
 *
 * @example
 * ```ts
 * import { register } from 'prom-client';
 * import { lockkitPrometheus } from '@lockkit/prometheus';
 * const metrics = lockkitPrometheus({ registry: register });
 * const locks = createLockKit(pool, { onEvent: metrics.onEvent });
 * metrics.observeScheduler(createScheduler(locks));
 * // expose `await register.metrics()` on /metrics
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
import { Counter, Histogram, type Registry } from 'prom-client';

/** Options of {@link lockkitPrometheus}. */
export interface LockkitPrometheusOptions {
  /** The registry to register the metrics in (prom-client's global `register`, or your own). */
  readonly registry: Registry;
  /** Prefix of every metric name (default `lockkit_`). */
  readonly prefix?: string;
}

/** What {@link lockkitPrometheus} returns. */
export interface LockkitPrometheus {
  /** Pass as `onEvent` to `createLockKit(…)` / `createLockClient(…)`. */
  readonly onEvent: LockkitEventListener;
  /** Counts a scheduler's outcomes; returns a function that stops observing. */
  observeScheduler(scheduler: Scheduler<unknown>): () => void;
}

const SECONDS = [
  0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
];

/**
 * Registers:
 * - `lockkit_lock_operations_total{outcome,scope,mode}` — outcome `committed`, `rolled-back`,
 *   `lost`, `skipped`, `timed-out` or `failed`;
 * - `lockkit_lock_wait_seconds{scope,mode}`, `lockkit_lock_hold_seconds{scope,mode}`;
 * - `lockkit_lease_events_total{event}` — event `claimed`, `renewed`, `lost` or `finished`;
 * - `lockkit_scheduler_runs_total{job,outcome}` — a scheduled tick's outcome (`ran`, `failed`,
 *   `skipped-held`, `skipped-done`, `missed`, `lease-lost`, `queue-full`);
 * - `lockkit_scheduler_run_seconds{job}`;
 * - `lockkit_scheduler_errors_total{job}` — a tick that could not be decided because the
 *   database failed (unreachable, restarting, …): alert on it.
 *
 * Labels stay bounded: lock keys, lease job keys and tokens are never labels (scheduled job names
 * are, as there are few of them).
 */
export function lockkitPrometheus(options: LockkitPrometheusOptions): LockkitPrometheus {
  const prefix = options.prefix ?? 'lockkit_';
  const registers = [options.registry];
  const operations = new Counter({
    name: `${prefix}lock_operations_total`,
    help: 'Lock operations by outcome',
    labelNames: ['outcome', 'scope', 'mode'],
    registers,
  });
  const wait = new Histogram({
    name: `${prefix}lock_wait_seconds`,
    help: 'Time from a lock attempt to its decision',
    labelNames: ['scope', 'mode'],
    buckets: SECONDS,
    registers,
  });
  const hold = new Histogram({
    name: `${prefix}lock_hold_seconds`,
    help: 'Time a lock was held',
    labelNames: ['scope', 'mode'],
    buckets: SECONDS,
    registers,
  });
  const leases = new Counter({
    name: `${prefix}lease_events_total`,
    help: 'Lease claims, renewals, losses and ends',
    labelNames: ['event'],
    registers,
  });
  const runs = new Counter({
    name: `${prefix}scheduler_runs_total`,
    help: 'Scheduled ticks by outcome',
    labelNames: ['job', 'outcome'],
    registers,
  });
  const runSeconds = new Histogram({
    name: `${prefix}scheduler_run_seconds`,
    help: 'Duration of scheduled runs',
    labelNames: ['job'],
    buckets: SECONDS,
    registers,
  });
  const errors = new Counter({
    name: `${prefix}scheduler_errors_total`,
    help: 'Scheduled ticks that could not be decided because the database failed',
    labelNames: ['job'],
    registers,
  });

  const onEvent: LockkitEventListener = (event: LockkitEvent) => {
    switch (event.type) {
      case 'lock-attempt':
        return;
      case 'lock-acquired':
        wait.observe({ scope: event.scope, mode: event.mode }, event.waitedMs / 1000);
        return;
      case 'lock-skipped':
        wait.observe({ scope: event.scope, mode: event.mode }, event.waitedMs / 1000);
        operations.inc({ outcome: 'skipped', scope: event.scope, mode: event.mode });
        return;
      case 'lock-timed-out':
        operations.inc({ outcome: 'timed-out', scope: event.scope, mode: event.mode });
        return;
      case 'lock-failed':
        operations.inc({ outcome: 'failed', scope: event.scope, mode: event.mode });
        return;
      case 'lock-released':
        operations.inc({ outcome: event.outcome, scope: event.scope, mode: event.mode });
        hold.observe({ scope: event.scope, mode: event.mode }, event.heldMs / 1000);
        return;
      default:
        leases.inc({ event: leaseEventName(event.type) });
    }
  };

  return {
    onEvent,
    observeScheduler(scheduler) {
      const listener = (event: SchedulerEvent) => {
        if (event.type === 'error') {
          errors.inc({ job: event.job });
          return;
        }
        runs.inc(
          { job: event.job, outcome: event.type },
          event.type === 'missed' ? event.ticks.length : 1,
        );
        if (event.type === 'ran') runSeconds.observe({ job: event.job }, event.durationMs / 1000);
      };
      const types = [...SCHEDULER_OUTCOMES, 'error'] as const;
      for (const type of types) scheduler.on(type, listener as never);
      return () => {
        for (const type of types) scheduler.off(type, listener as never);
      };
    },
  };
}

/** `lease-claimed` → `claimed`: the value of the `event` label, as the README lists them. */
function leaseEventName(type: `lease-${string}`): string {
  return type.slice('lease-'.length);
}
