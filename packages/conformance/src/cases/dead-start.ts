/**
 * The dead-start group: a pool lends an idle connection whose far side hung up a moment ago, and
 * the client has not read the goodbye yet. Directly, that is a backend terminated (by an operator,
 * a failover, an idle timeout): its FATAL and the socket's close are held at a proxy until the
 * call has spoken on the dead connection. Through PgBouncer, a terminated backend is PgBouncer's
 * server connection, which an idle client does not hold in transaction mode (PgBouncer drops it
 * and gives the client another): what an idle client can meet there is PgBouncer hanging up the
 * client link itself (a restart, its `client_idle_timeout`, a crashed server under the link),
 * so the proxy ends its link to PgBouncer and holds that close.
 *
 * For each protocol that draws a pooled connection, the call must either run its task exactly
 * once on a live connection, or reject with a typed `CONNECTION_LOST` whose task did not run; and
 * then the next call runs, on another connection (the dead one is never lent again). The fixture
 * fails the case if a connection is left checked out or inside a transaction, or a lock is left.
 */
import { createLockClient, hasCapability, isLockkitError, type LockClient } from '@lockkit/core';
import { expect, onTestFinished } from 'vitest';
import {
  type ConformanceAdapter,
  type ConformanceCaseId,
  type DeadStartPath,
  type DeadStartProtocolId,
  randomKey,
} from '../harness.js';
import { type GoodbyeHold, startRoundTripProxy, type WireStatement } from '../proxy.js';
import { caseIt, type Fixture, withLockkitSchema } from '../suite.js';

/** The protocols of the group: each draws one connection from the pool before its task. */
export const DEAD_START_PROTOCOLS: readonly DeadStartProtocolId[] = [
  'run-exclusive-job',
  'with-lock-try',
  'with-lock-wait',
  'with-session-lock',
  'run-with-lease',
];

/**
 * The case ids of the dead-start group on `path` for these protocols, with one reason: what an
 * adapter lists in `expectedFailures` or `disable` for a known defect.
 *
 * @example
 * ```ts
 * expectedFailures: deadStartCaseIds('terminated', DEAD_START_PROTOCOLS, 'the next call fails'),
 * ```
 */
export function deadStartCaseIds(
  path: DeadStartPath,
  protocols: readonly DeadStartProtocolId[],
  reason: string,
): Partial<Record<ConformanceCaseId, string>> {
  const ids: Partial<Record<ConformanceCaseId, string>> = {};
  for (const protocol of protocols) ids[`dead-start.${path}.${protocol}`] = reason;
  return ids;
}

/** How long the call may take to speak on the dead connection before the case fails by name. */
const SPEAK_WATCHDOG_MS = 10_000;

/** One call of a protocol, its task counting its runs; resolves with what the call settled to. */
type Call = <Tx, Session>(
  locks: LockClient<Tx, Session>,
  ran: () => void,
) => Promise<{ executed: boolean; result?: unknown }>;

const NAMESPACE = 'lockkit-dead-start';

const CALLS: Record<DeadStartProtocolId, Call> = {
  'run-exclusive-job': (locks, ran) =>
    locks.runExclusiveJob(NAMESPACE, 'job', async (_tx, ctx) => {
      ran();
      await ctx.query('SELECT 1');
      return 'ran';
    }),
  'with-lock-try': (locks, ran) =>
    locks.withLock(randomKey(), async (_tx, ctx) => {
      ran();
      await ctx.query('SELECT 1');
      return 'ran';
    }),
  'with-lock-wait': (locks, ran) =>
    locks.withLock(
      randomKey(),
      async (_tx, ctx) => {
        ran();
        await ctx.query('SELECT 1');
        return 'ran';
      },
      { wait: true },
    ),
  'with-session-lock': (locks, ran) =>
    locks.withSessionLock(randomKey(), async (_session, ctx) => {
      ran();
      await ctx.query('SELECT 1');
      return 'ran';
    }),
  'run-with-lease': (locks, ran) =>
    locks.runWithLease(
      NAMESPACE,
      'lease',
      async () => {
        ran();
        return 'ran';
      },
      { ttlMs: 20_000 },
    ),
};

/** `promise`, or a rejection naming `what` once `ms` have passed. */
async function within<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  try {
    return await Promise.race([
      promise,
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(`${what} within ${ms} ms`)), ms);
      }),
    ]);
  } finally {
    clearTimeout(timer);
  }
}

/** Ends the held connections' far side: a terminated backend, or a pooler's hang-up. */
async function killHeld<Tx, Session>(
  f: Fixture<Tx, Session>,
  hold: GoodbyeHold,
  path: DeadStartPath,
): Promise<void> {
  if (path === 'pooler-hung-up') {
    hold.hangUp();
    return;
  }
  // With a timeout, pg_terminate_backend returns once the backend has exited.
  // In the select list, not the WHERE clause: only the rows that match are terminated.
  const rows = await f.observer.query<{ gone: boolean }>(
    `SELECT pg_terminate_backend(pid, 5000) AS gone FROM pg_stat_activity
      WHERE client_port = ANY($1::int[]) AND application_name = $2`,
    [hold.serverPorts, f.applicationName],
  );
  expect(
    rows.map((r) => r.gone),
    'backends terminated behind the held connections',
  ).toEqual(hold.connections.map(() => true));
}

/** Declares the group's cases for `adapter` on `path`. */
export function deadStartCases<Tx, Session>(
  adapter: ConformanceAdapter<Tx, Session>,
  fixture: () => Fixture<Tx, Session>,
  path: DeadStartPath,
): void {
  // Capabilities are properties of the executor: a probe instance that never connects.
  const probe = adapter.createInstance({ url: adapter.databaseUrl(), poolSize: 1 });
  const session = hasCapability(probe.executor, 'session');
  void probe.close();
  for (const protocol of DEAD_START_PROTOCOLS) {
    const noSession =
      protocol !== 'with-session-lock'
        ? undefined
        : path === 'pooler-hung-up'
          ? 'session scope is refused through a transaction pooler (the pooler group proves it)'
          : session
            ? undefined
            : `the ${adapter.name} executor has no session capability`;
    const scoped =
      noSession === undefined
        ? adapter
        : {
            ...adapter,
            disable: { ...adapter.disable, [`dead-start.${path}.${protocol}`]: noSession },
          };
    caseIt(
      scoped,
      `dead-start.${path}.${protocol}`,
      path === 'terminated'
        ? `${protocol} on a pooled connection whose backend was just terminated (goodbye held): runs once on a fresh connection or rejects CONNECTION_LOST unrun; the next call runs on another connection`
        : `${protocol} on a pooled connection whose link PgBouncer just hung up (goodbye held): runs once on a fresh connection or rejects CONNECTION_LOST unrun; the next call runs on another connection`,
      async () => {
        const f = fixture();
        const proxy = await startRoundTripProxy(f.url);
        // Closed after the fixture's checks, which may still talk through it.
        onTestFinished(() => proxy.close());
        const instance = f.newInstance(1, proxy.url);
        const run = async (schema: string | undefined) => {
          const locks = createLockClient(instance.executor, {
            engineSelfTest: false,
            ...(schema !== undefined && { schema }),
          });
          let runs = 0;
          const call = () => CALLS[protocol](locks, () => runs++);
          // Warm up: the pool's one connection is open and idle, the driver's own first queries done.
          expect(await call(), 'warm-up').toMatchObject({ executed: true, result: 'ran' });
          // A session's connection is closed after its task, not given back: a session lock
          // draws an idle connection that transactions left in the pool.
          if (protocol === 'with-session-lock')
            expect(await CALLS['with-lock-try'](locks, () => {}), 'warm-up').toMatchObject({
              executed: true,
            });
          runs = 0;
          const hold = proxy.holdGoodbyes();
          expect(hold.connections.length, 'idle connections held').toBeGreaterThan(0);
          await killHeld(f, hold, path);
          const during = proxy.record();
          const pending = call().then(
            (value) => ({ value }),
            (error: unknown) => ({ error }),
          );
          await within(hold.clientSpoke, SPEAK_WATCHDOG_MS, 'the call never spoke on the pool');
          hold.release();
          const outcome = await pending;
          const sent = during.stop();
          // Else the case proved nothing: the pool must have lent the dead connection.
          expect(
            sent.filter((s) => hold.connections.includes(s.connection)).length,
            `statements the call sent on the dead connection (it sent: ${JSON.stringify(sent)})`,
          ).toBeGreaterThan(0);
          if ('error' in outcome) {
            const { error } = outcome;
            expect(
              isLockkitError(error) ? error.code : `untyped: ${String(error)}`,
              `the call rejected: ${String(error)}`,
            ).toBe('CONNECTION_LOST');
            expect(runs, 'task runs of a call that rejected').toBe(0);
          } else {
            expect(outcome.value, 'the call resolved').toMatchObject({
              executed: true,
              result: 'ran',
            });
            expect(runs, 'task runs').toBe(1);
          }
          // The dead connection is discarded: the next call runs, and says nothing on it.
          runs = 0;
          const recording = proxy.record();
          let seen: WireStatement[] = [];
          try {
            expect(await call(), 'the next call').toMatchObject({ executed: true, result: 'ran' });
          } finally {
            seen = recording.stop();
          }
          expect(runs, 'task runs of the next call').toBe(1);
          expect(
            seen.filter((s) => hold.connections.includes(s.connection)).map((s) => s.text),
            'statements of the next call sent on the dead connection',
          ).toEqual([]);
        };
        if (protocol === 'run-with-lease') await withLockkitSchema(f, (schema) => run(schema));
        else await run(undefined);
      },
      30_000,
    );
  }
}
