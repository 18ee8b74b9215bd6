/**
 * The fault-point group: for each lock protocol, the statements it sends are recorded through the
 * suite's TCP proxy; then, for every statement boundary k of that recording and every fault kind,
 * the operation runs again with exactly that one fault at statement k, and a judge checks the
 * invariants (see `fault-invariants.ts`): the reported outcome against the database, nothing left
 * behind, and a second call afterwards taking the lock and running. Boundaries are recorded per
 * adapter and driver, never written down.
 *
 * One test per (protocol, fault) loops over the boundaries; a violation names
 * `protocol / boundary k (statement head) / fault`, and `LOCKKIT_TEST_FAULT_BOUNDARY=k` replays
 * only boundary k. Each test logs how many combinations it covered, and the group logs the total.
 */
import { randomBytes } from 'node:crypto';
import { createLockClient, type JobResult, type LockClient } from '@lockkit/core';
import { afterAll, expect, onTestFinished } from 'vitest';
import {
  judgeLeftovers,
  judgeTruth,
  outcomeName,
  type Settled,
  settle,
  type TruthRules,
} from '../fault-invariants.js';
import {
  type ConformanceAdapter,
  type ConformanceCaseId,
  type FaultKind,
  type FaultProtocolId,
  randomKey,
} from '../harness.js';
import { startRoundTripProxy, type WireFault, type WireStatement } from '../proxy.js';
import { casesOf, type Fixture } from '../suite.js';

/** One protocol under test: how to run it once with a task that writes `id`. */
interface Protocol {
  readonly id: FaultProtocolId;
  /** Session scope: the task's write commits on its own, not with the lock. */
  readonly session: boolean;
  run<Tx, Session>(
    locks: LockClient<Tx, Session>,
    target: { readonly key: ReturnType<typeof randomKey>; readonly jobKey: string },
    write: (
      query: (text: string, params?: readonly unknown[]) => Promise<unknown>,
    ) => Promise<number>,
    signal: AbortSignal,
  ): Promise<JobResult<unknown>>;
}

/** The transaction-scope protocols the group searches, by id. */
export const TRANSACTION_FAULT_PROTOCOLS: readonly FaultProtocolId[] = [
  'run-exclusive-job',
  'with-lock-try-shared',
  'with-lock-wait-exclusive',
  'with-lock-wait-shared',
];

/** The session-scope protocols the group searches (where the adapter has session scope), by id. */
export const SESSION_FAULT_PROTOCOLS: readonly FaultProtocolId[] = [
  'with-session-lock-try',
  'with-session-lock-wait',
];

/**
 * The case ids of the fault-point group for these faults and protocols (default: all), with one
 * reason: what an adapter lists in `expectedFailures` or `disable` for a known defect.
 *
 * @example
 * ```ts
 * expectedFailures: faultPointCaseIds(['drop-before'], TRANSACTION_FAULT_PROTOCOLS, 'BEGIN leaks'),
 * ```
 */
export function faultPointCaseIds(
  faults: readonly FaultKind[],
  protocols: readonly FaultProtocolId[],
  reason: string,
): Partial<Record<ConformanceCaseId, string>> {
  const ids: Partial<Record<ConformanceCaseId, string>> = {};
  for (const protocol of protocols)
    for (const fault of faults) ids[`faults.${protocol}.${fault}`] = reason;
  return ids;
}

const TRANSACTION_PROTOCOLS: readonly Protocol[] = [
  {
    id: 'run-exclusive-job',
    session: false,
    run: (locks, t, write, signal) =>
      locks.runExclusiveJob('lockkit-fault-points', t.jobKey, (_tx, ctx) => write(ctx.query), {
        signal,
      }),
  },
  {
    id: 'with-lock-try-shared',
    session: false,
    run: (locks, t, write, signal) =>
      locks.withLock(t.key, (_tx, ctx) => write(ctx.query), { mode: 'shared', signal }),
  },
  {
    id: 'with-lock-wait-exclusive',
    session: false,
    run: (locks, t, write, signal) =>
      locks.withLock(t.key, (_tx, ctx) => write(ctx.query), {
        wait: true,
        timeoutMs: 500,
        signal,
      }),
  },
  {
    id: 'with-lock-wait-shared',
    session: false,
    run: (locks, t, write, signal) =>
      locks.withLock(t.key, (_tx, ctx) => write(ctx.query), {
        mode: 'shared',
        wait: true,
        timeoutMs: 500,
        signal,
      }),
  },
];

const SESSION_PROTOCOLS: readonly Protocol[] = [
  {
    id: 'with-session-lock-try',
    session: true,
    run: (locks, t, write, signal) =>
      locks.withSessionLock(t.key, (_s, ctx) => write(ctx.query), { signal }),
  },
  {
    id: 'with-session-lock-wait',
    session: true,
    run: (locks, t, write, signal) =>
      locks.withSessionLock(t.key, (_s, ctx) => write(ctx.query), {
        wait: true,
        timeoutMs: 500,
        signal,
      }),
  },
];

/**
 * The fault kinds, each as the proxy trap it sets on statement k and what happens once the trap
 * holds or has cut the link.
 */
const FAULTS: readonly {
  readonly id: FaultKind;
  readonly title: string;
  readonly wire: WireFault;
  /** After the trap fired: `abort` the caller's signal, or `terminate` the backends. */
  readonly action?: 'abort' | 'terminate';
  readonly honestCodes: readonly string[];
}[] = [
  {
    id: 'drop-before',
    title: 'the link is cut before statement k reaches the server',
    wire: 'drop-before',
    // A client that sent COMMIT cannot tell whether it reached the server: "unknown" is the truth.
    honestCodes: ['CONNECTION_LOST', 'COMMIT_OUTCOME_UNKNOWN'],
  },
  {
    id: 'drop-after',
    title: 'the server runs statement k, the link is cut before its answer arrives',
    wire: 'drop-after',
    honestCodes: ['CONNECTION_LOST', 'COMMIT_OUTCOME_UNKNOWN'],
  },
  {
    id: 'late-reply',
    title:
      "the server runs statement k, its answer is held past the caller's timeout (its signal fires), then delivered",
    wire: 'hold-reply',
    action: 'abort',
    honestCodes: ['ABORTED'],
  },
  {
    id: 'terminated',
    title: 'the backend is terminated from outside while statement k is held before the server',
    wire: 'hold-statement',
    action: 'terminate',
    honestCodes: ['CONNECTION_LOST', 'COMMIT_OUTCOME_UNKNOWN'],
  },
  {
    id: 'aborted',
    title: "the caller's signal fires while statement k is held before the server",
    wire: 'hold-statement',
    action: 'abort',
    honestCodes: ['ABORTED'],
  },
];

/** Lets every callback queued so far (an abort's listeners, their first writes) run. */
export const drain = () =>
  new Promise<void>((resolve) => setImmediate(() => setImmediate(resolve)));

/** Bounds a call that never settles, so that the violation names its point instead of a timeout. */
const WATCHDOG_MS = 5000;

/** The boundary to replay alone, from `LOCKKIT_TEST_FAULT_BOUNDARY`, or undefined for all. */
export function boundaryFromEnv(): number | undefined {
  const raw = process.env.LOCKKIT_TEST_FAULT_BOUNDARY;
  if (raw === undefined || raw === '') return undefined;
  const k = Number(raw);
  if (!Number.isInteger(k) || k < 0)
    throw new Error(`LOCKKIT_TEST_FAULT_BOUNDARY must be a boundary index, got '${raw}'`);
  return k;
}

/** The first words of a statement, for naming a boundary. */
export const head = (statement: WireStatement | undefined): string =>
  statement === undefined ? '?' : statement.text.replace(/\s+/g, ' ').trim().slice(0, 60);

/**
 * Declares the fault-point tests. `sessionScope`: whether the session protocols run here (the
 * executor has the session capability and the connections are direct).
 */
export function faultPointCases<Tx, Session>(
  adapter: ConformanceAdapter<Tx, Session>,
  fixture: () => Fixture<Tx, Session>,
  sessionScope: boolean,
): void {
  const test = casesOf(adapter);
  const protocols = [...TRANSACTION_PROTOCOLS, ...(sessionScope ? SESSION_PROTOCOLS : [])];
  let covered = 0;
  afterAll(() => {
    if (covered > 0)
      console.log(
        `[lockkit fault points] ${adapter.name}: ${covered} (operation, boundary, fault) combinations covered`,
      );
  });
  for (const protocol of protocols) {
    for (const fault of FAULTS) {
      test(
        `faults.${protocol.id}.${fault.id}`,
        `${protocol.id}: at every statement boundary k, ${fault.title}; the call tells the truth and leaves nothing behind`,
        async () => {
          const f = fixture();
          const table = `lockkit_fault_${randomBytes(6).toString('hex')}`;
          await f.observer.query(`CREATE TABLE ${table} (id int PRIMARY KEY)`);
          const proxy = await startRoundTripProxy(f.url);
          // Closed after the fixture's checks, which may still talk through it.
          onTestFinished(() => proxy.close());
          try {
            await searchFaultPoints(f, protocol, fault, table, proxy, (n) => {
              covered += n;
            });
          } finally {
            await f.observer.query(`DROP TABLE IF EXISTS ${table}`);
          }
        },
        60_000,
      );
    }
  }
}

/** Records the protocol's statements, then runs it once per boundary with the fault there. */
async function searchFaultPoints<Tx, Session>(
  f: Fixture<Tx, Session>,
  protocol: Protocol,
  fault: (typeof FAULTS)[number],
  table: string,
  proxy: Awaited<ReturnType<typeof startRoundTripProxy>>,
  count: (combinations: number) => void,
): Promise<void> {
  // A pool of one: every run reuses the same connection, so the statements are the same each time.
  // Closed here, not by the fixture: a connection a fault leaked is a violation reported below,
  // and must not hang the fixture's close.
  const instance = f.adapter.createInstance({ url: proxy.url, poolSize: 1 });
  try {
    await searchWith(f, protocol, fault, table, proxy, count, instance);
  } finally {
    // A pool whose connection a fault leaked never finishes closing (that leak is already a
    // reported violation): bounded, shorter.
    await bounded(
      instance.close().catch(() => undefined),
      undefined,
      500,
    );
  }
}

/** {@link searchFaultPoints} over its instance. */
async function searchWith<Tx, Session>(
  f: Fixture<Tx, Session>,
  protocol: Protocol,
  fault: (typeof FAULTS)[number],
  table: string,
  proxy: Awaited<ReturnType<typeof startRoundTripProxy>>,
  count: (combinations: number) => void,
  instance: ReturnType<ConformanceAdapter<Tx, Session>['createInstance']>,
): Promise<void> {
  const locks = createLockClient(instance.executor, { engineSelfTest: false });
  const target = { key: randomKey(), jobKey: randomBytes(8).toString('hex') };
  let nextId = 0;
  const writer =
    (id: number) =>
    async (query: (text: string, params?: readonly unknown[]) => Promise<unknown>) => {
      await query(`INSERT INTO ${table} (id) VALUES ($1)`, [id]);
      return id;
    };
  const committed = async (id: number) =>
    (await f.observer.query(`SELECT 1 FROM ${table} WHERE id = $1`, [id])).length === 1;
  /** An unfaulted run that must execute: the warm-up, and the second caller after each fault. */
  const cleanRun = async (first = false): Promise<string | undefined> => {
    const id = ++nextId;
    const running = settle(protocol.run(locks, target, writer(id), new AbortController().signal));
    // The first call of an instance may start a driver's engine (Prisma): bounded more loosely.
    const outcome = first
      ? await bounded(running, { kind: 'rejected', error: new Error('no warm-up in 20 s') }, 20_000)
      : await withWatchdog(running);
    if (outcome.kind === 'resolved' && outcome.value.executed && (await committed(id)))
      return undefined;
    return `the next caller could not run: ${outcomeName(outcome)}`;
  };

  // Warm up (the driver's own first queries, session pinning checks), then record.
  expect(await cleanRun(true), 'warm-up run').toBeUndefined();
  const recorder = proxy.record();
  expect(await cleanRun(), 'recorded run').toBeUndefined();
  const recorded = recorder.stop();
  expect(recorded.length, 'statements recorded').toBeGreaterThan(0);

  const rules: TruthRules = {
    workCommitsWithLock: !protocol.session,
    honestCodes: fault.honestCodes,
  };
  const only = boundaryFromEnv();
  const violations: string[] = [];
  const outcomes: string[] = [];
  let combinations = 0;
  for (let k = 0; k < recorded.length; k++) {
    if (only !== undefined && k !== only) continue;
    const point = `${protocol.id} / boundary ${k} (${head(recorded[k])}) / ${fault.id}`;
    const found: string[] = [];
    const id = ++nextId;
    const controller = new AbortController();
    const trap = proxy.trapStatement(k, fault.wire);
    const call = settle(protocol.run(locks, target, writer(id), controller.signal));
    const first = await Promise.race([trap.fired, withWatchdog(call).then(() => undefined)]);
    if (first === undefined) {
      trap.release();
      found.push(
        'the call settled before statement k was sent: the recording is not deterministic',
      );
    } else {
      if (first.text !== recorded[k]?.text)
        found.push(
          `statement k was '${head(first)}' in this run: the recording is not deterministic`,
        );
      if (fault.action === 'abort') {
        controller.abort(new Error('the caller gave up (fault point)'));
        await Promise.race([call, drain()]);
      } else if (fault.action === 'terminate') {
        await f.observer.query(
          `SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity
            WHERE application_name = $1 AND pid <> pg_backend_pid()`,
          [f.applicationName],
        );
      }
      trap.release();
    }
    const outcome = await withWatchdog(call);
    outcomes.push(`${k}:${outcomeName(outcome)}`);
    found.push(...judgeTruth(outcome, await committed(id), rules));
    const leftovers = await judgeLeftovers(f.observer, f.applicationName, instance);
    found.push(...leftovers);
    combinations++;
    // A connection still out of a pool of one would wedge every later run: stop here.
    if (leftovers.some((v) => v.includes('checked out'))) {
      violations.push(...found.map((v) => `${point}: ${v}`));
      break;
    }
    const next = await cleanRun();
    violations.push(...found.map((v) => `${point}: ${v}`));
    // A caller after the fault that cannot run: later boundaries would only measure that.
    if (next !== undefined) {
      violations.push(`${point}: ${next}`);
      break;
    }
  }
  console.log(
    `[lockkit fault points] ${f.adapter.name} ${protocol.id} / ${fault.id}: ${combinations} boundaries [${outcomes.join(' ')}]`,
  );
  count(combinations);
  // The violations in the message too: a digest that keeps only the assertion line still names them.
  expect(violations, violations.join(' | ')).toEqual([]);
}

/** `outcome`, or a rejection standing for "never settled" after {@link WATCHDOG_MS}. */
export function withWatchdog(outcome: Promise<Settled>): Promise<Settled> {
  return bounded(outcome, {
    kind: 'rejected',
    error: new Error(`the call did not settle within ${WATCHDOG_MS} ms`),
  });
}

/** `promise`, or `late` once `ms` (default {@link WATCHDOG_MS}) have passed without it settling. */
export async function bounded<T>(promise: Promise<T>, late: T, ms = WATCHDOG_MS): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const watchdog = new Promise<T>((resolve) => {
    timer = setTimeout(() => resolve(late), ms);
  });
  try {
    return await Promise.race([promise, watchdog]);
  } finally {
    clearTimeout(timer);
  }
}
