/**
 * `@lockkit/conformance`: the suite every lockkit adapter must pass against a real PostgreSQL.
 *
 * @example
 * ```ts
 * // packages/my-adapter/test/conformance.test.ts
 * import { runConformance } from '@lockkit/conformance';
 * runConformance({
 *   name: 'my-adapter',
 *   databaseUrl: () => process.env.DATABASE_URL!,
 *   createInstance: ({ url, poolSize }) => {
 *     const pool = new Pool({ connectionString: url, max: poolSize });
 *     return { executor: myExecutor(pool), close: () => pool.end() };
 *   },
 * });
 * ```
 *
 * @packageDocumentation
 */
import { hasCapability } from '@lockkit/core';
import { describe } from 'vitest';
import { deadStartCases } from './cases/dead-start.js';
import { engineSelfTestCases } from './cases/engine-self-test.js';
import { faultPointCases } from './cases/fault-points.js';
import { leaseFaultPointCases } from './cases/fault-points-leases.js';
import { schedulerFaultPointCases } from './cases/fault-points-scheduler.js';

export { DEAD_START_PROTOCOLS, deadStartCaseIds } from './cases/dead-start.js';
export {
  faultPointCaseIds,
  SESSION_FAULT_PROTOCOLS,
  TRANSACTION_FAULT_PROTOCOLS,
} from './cases/fault-points.js';
export { LEASE_FAULT_PROTOCOLS } from './cases/fault-points-leases.js';
export {
  SCHEDULER_FAULT_OPERATIONS,
  schedulerFaultPointCaseIds,
} from './cases/fault-points-scheduler.js';

import { leaseCases } from './cases/leases.js';
import { lockTruthCases } from './cases/lock-truth.js';
import { pipeliningCases } from './cases/pipelining.js';
import { poolerCases } from './cases/pooler.js';
import { robustnessCases } from './cases/robustness.js';
import { schedulerCases } from './cases/scheduler.js';
import { schedulerLedgerCases } from './cases/scheduler-ledger.js';
import { schedulerOverlapRaceCases } from './cases/scheduler-overlap-races.js';
import { schedulerTimingCases } from './cases/scheduler-timing.js';
import { sessionCases } from './cases/session.js';
import { standbyCases } from './cases/standby.js';
import { transactionCases } from './cases/transaction.js';
import type { ConformanceAdapter } from './harness.js';
import {
  CONFORMANCE_GROUPS,
  type ConformanceGroup,
  checkConformanceOptions,
  type RunConformanceOptions,
  schedulerSecondsFromEnv,
} from './options.js';
import { type Fixture, useFixture } from './suite.js';

export {
  type AdapterInstance,
  type ConformanceAdapter,
  type ConformanceCaseId,
  type DeadStartPath,
  type DeadStartProtocolId,
  type FaultKind,
  type FaultProtocolId,
  type ObservedLock,
  Observer,
  randomInt8Key,
  randomKey,
  type SchedulerFaultOperationId,
  type SingleConnectionInstance,
  type StandbyServer,
  taggedUrl,
} from './harness.js';
export {
  CONFORMANCE_GROUPS,
  type ConformanceGroup,
  checkConformanceOptions,
  type RunConformanceOptions,
} from './options.js';
export {
  type GoodbyeHold,
  type RoundTripProxy,
  type RoundTripProxyOptions,
  type StatementTrap,
  startRoundTripProxy,
  type WireFault,
  type WireStatement,
} from './proxy.js';

/** Why the scheduler and migration fault points are skipped where the option did not ask for them. */
const SCHEDULER_FAULTS_NOT_ENABLED =
  'not enabled for this adapter (runConformance option schedulerFaultPoints)';

/**
 * Declares the whole suite as vitest tests, grouped by capability. A group whose capability the
 * adapter lacks is declared as a visibly skipped group that says so; single cases can be disabled
 * with a reason through `adapter.disable`. Every test uses a fresh adapter instance and random
 * keys, checks results from outside through its own `pg` connection, and fails if it leaves an
 * advisory lock, a checked-out connection or an open transaction behind.
 */
export function runConformance<Tx, Session>(
  adapter: ConformanceAdapter<Tx, Session>,
  options: RunConformanceOptions = {},
): void {
  const checked = checkConformanceOptions(options);
  const groups = new Set<ConformanceGroup>(checked.groups ?? CONFORMANCE_GROUPS);
  // Capabilities are properties of the executor object: a probe instance that never connects.
  const probe = adapter.createInstance({ url: adapter.databaseUrl(), poolSize: 1 });
  const capabilities = {
    session: hasCapability(probe.executor, 'session'),
    pipelinedTransaction: hasCapability(probe.executor, 'pipelinedTransaction'),
  };
  void probe.close();

  // A CI pass that runs only the PgBouncer groups (its other pass runs the direct ones).
  const directOff =
    process.env.LOCKKIT_TEST_DIRECT === '0'
      ? 'LOCKKIT_TEST_DIRECT=0 leaves the direct groups to another pass of this run'
      : undefined;

  describe(`lockkit conformance: ${adapter.name}`, () => {
    const group = (
      name: ConformanceGroup,
      missing: string | undefined,
      cases: typeof transactionCases,
    ) => {
      if (!groups.has(name)) return;
      if (directOff) {
        describe.skip(`${name} — skipped: ${directOff}`, () => {
          cases(adapter, () => {
            throw new Error('skipped group');
          });
        });
        return;
      }
      if (missing) {
        describe.skip(`${name} — skipped: the ${adapter.name} executor has no ${missing}`, () => {
          cases(adapter, () => {
            throw new Error('skipped group');
          });
        });
        return;
      }
      describe(name, () => cases(adapter, useFixture(adapter)));
    };
    group('transaction', undefined, transactionCases);
    group('session', capabilities.session ? undefined : 'session capability', sessionCases);
    group(
      'pipelining',
      capabilities.pipelinedTransaction ? undefined : 'pipelinedTransaction capability',
      pipeliningCases,
    );
    group('robustness', undefined, robustnessCases);
    group('truth', undefined, lockTruthCases);
    group('leases', undefined, leaseCases);
    const schedulerSeconds = schedulerSecondsFromEnv() ?? checked.schedulerSeconds;
    group('scheduler', undefined, (a, f) => allSchedulerCases(a, f, schedulerSeconds));
    group('engine', undefined, (a, f) => engineSelfTestCases(a, f, 'direct'));
    const schedulerFaults = checked.schedulerFaultPoints ?? false;
    group('faults', undefined, (a, f) => {
      faultPointCases(a, f, capabilities.session);
      leaseFaultPointCases(a, f);
      schedulerFaultPointCases(
        a,
        f,
        schedulerFaults === true
          ? undefined
          : schedulerFaults === 'through-pgbouncer'
            ? "searched through PgBouncer only in this configuration (runConformance option schedulerFaultPoints: 'through-pgbouncer')"
            : SCHEDULER_FAULTS_NOT_ENABLED,
      );
    });
    group('dead-start', undefined, (a, f) => deadStartCases(a, f, 'terminated'));
    if (groups.has('standby')) {
      // Its own server, a hot standby shared by the group's cases.
      const start = adapter.standby;
      if (directOff !== undefined || start === undefined) {
        const why = directOff ?? 'the adapter gives no standby server (ConformanceAdapter.standby)';
        describe.skip(`standby — skipped: ${why}`, () => {
          standbyCases(adapter, async () => ({ url: '', stop: async () => {} }), capabilities);
        });
      } else {
        describe('standby', () => standbyCases(adapter, start, capabilities));
      }
    }

    if (!adapter.pgbouncer) return;
    const bouncer = adapter.pgbouncer();
    if ('missing' in bouncer) {
      const why = bouncer.missing;
      describe.skip(`through PgBouncer (transaction mode) — skipped: ${why}`, () => {
        cases(throughBouncer(adapter, ''), () => {
          throw new Error('skipped group');
        });
      });
      return;
    }
    describe('through PgBouncer (transaction mode)', () => {
      const pooled = throughBouncer(adapter, bouncer.url);
      for (const [name, cases] of [
        ['transaction', transactionCases],
        ['pipelining', pipeliningCases],
        ['robustness', robustnessCases],
        ['leases', leaseCases],
        ['scheduler', allSchedulerCases],
        ['engine', engineCasesThroughBouncer],
        ['dead-start', deadStartCasesThroughBouncer],
        [
          'faults',
          (a: typeof pooled, f: () => Fixture<Tx, Session>) =>
            faultPointCasesThroughBouncer(
              a,
              f,
              schedulerFaults === false ? SCHEDULER_FAULTS_NOT_ENABLED : undefined,
            ),
        ],
      ] as const) {
        if (!groups.has(name)) continue;
        if (name === 'pipelining' && !capabilities.pipelinedTransaction) continue;
        describe(name, () => cases(pooled, useFixture(pooled)));
      }
      describe('pooler', () => {
        const direct = { ...adapter, name: `${adapter.name} via PgBouncer` };
        const bouncerAdapter = {
          ...direct,
          databaseUrl: () => bouncer.url,
          observerUrl: adapter.observerUrl ?? adapter.databaseUrl,
        };
        poolerCases(bouncerAdapter, useFixture(bouncerAdapter), bouncer);
      });
    });
  });
}

/** The adapter as it runs through PgBouncer: declared pooler, observer still direct. */
function throughBouncer<Tx, Session>(
  adapter: ConformanceAdapter<Tx, Session>,
  url: string,
): ConformanceAdapter<Tx, Session> {
  return {
    ...adapter,
    name: `${adapter.name} via PgBouncer`,
    databaseUrl: () => url,
    observerUrl: adapter.observerUrl ?? adapter.databaseUrl,
    createInstance: (options) => adapter.createInstance({ transactionPooler: true, ...options }),
  };
}

/** Every case group, for declaring a visibly skipped copy of the PgBouncer groups. */
function cases<Tx, Session>(
  adapter: ConformanceAdapter<Tx, Session>,
  fixture: () => ReturnType<ReturnType<typeof useFixture<Tx, Session>>>,
): void {
  transactionCases(adapter, fixture);
  pipeliningCases(adapter, fixture);
  robustnessCases(adapter, fixture);
  leaseCases(adapter, fixture);
  allSchedulerCases(adapter, fixture);
  engineCasesThroughBouncer(adapter, fixture);
  faultPointCasesThroughBouncer(adapter, fixture, SCHEDULER_FAULTS_NOT_ENABLED);
  deadStartCasesThroughBouncer(adapter, fixture);
  poolerCases(adapter, fixture, { url: '', singleConnectionUrl: '' });
}

/** The engine group through PgBouncer: without the stub cases (PgBouncer refuses their `options`). */
function engineCasesThroughBouncer<Tx, Session>(
  adapter: ConformanceAdapter<Tx, Session>,
  fixture: () => ReturnType<ReturnType<typeof useFixture<Tx, Session>>>,
): void {
  engineSelfTestCases(adapter, fixture, 'pgbouncer');
}

/** The dead-start group through PgBouncer: the link PgBouncer hangs up, session scope skipped. */
function deadStartCasesThroughBouncer<Tx, Session>(
  adapter: ConformanceAdapter<Tx, Session>,
  fixture: () => ReturnType<ReturnType<typeof useFixture<Tx, Session>>>,
): void {
  deadStartCases(adapter, fixture, 'pooler-hung-up');
}

/** The fault-point group through PgBouncer: transaction scope only (session scope is refused there). */
function faultPointCasesThroughBouncer<Tx, Session>(
  adapter: ConformanceAdapter<Tx, Session>,
  fixture: () => ReturnType<ReturnType<typeof useFixture<Tx, Session>>>,
  schedulerFaultsOff: string | undefined,
): void {
  faultPointCases(adapter, fixture, false);
  leaseFaultPointCases(adapter, fixture);
  schedulerFaultPointCases(adapter, fixture, schedulerFaultsOff);
}

/**
 * The scheduler group: its behaviour cases, its timing cases, its ledger-protocol cases, then its
 * overlap-judgement races.
 */
function allSchedulerCases<Tx, Session>(
  adapter: ConformanceAdapter<Tx, Session>,
  fixture: () => ReturnType<ReturnType<typeof useFixture<Tx, Session>>>,
  workerSeconds?: number,
): void {
  schedulerCases(adapter, fixture, workerSeconds);
  schedulerTimingCases(adapter, fixture);
  schedulerLedgerCases(adapter, fixture);
  schedulerOverlapRaceCases(adapter, fixture);
}
