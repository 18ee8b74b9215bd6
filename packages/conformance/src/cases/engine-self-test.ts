/**
 * The engine self-test: a lock client checks once, before its first lock is trusted, that the
 * server really holds advisory locks. On a real server (direct, or through PgBouncer) it passes and
 * leaves nothing behind; on a simulated fake — a schema of stub advisory-lock functions put ahead
 * of `pg_catalog` on the `search_path`, which answer `true` and lock nothing — the first lock call
 * rejects with `ENGINE_LOCKS_NOT_REAL` and the task never runs.
 */
import { randomBytes } from 'node:crypto';
import {
  createLockClient,
  EngineLocksNotRealError,
  hasCapability,
  isLockkitError,
  type LockExecutor,
  type Row,
} from '@lockkit/core';
import { expect } from 'vitest';
import { type ConformanceAdapter, randomKey, rejection } from '../harness.js';
import { caseIt, type Fixture } from '../suite.js';

/** Every advisory-lock function lockkit calls, as a stub that locks nothing. */
const STUBS = [
  ['pg_try_advisory_xact_lock(int4, int4)', 'boolean', 'true'],
  ['pg_try_advisory_xact_lock(int8)', 'boolean', 'true'],
  ['pg_try_advisory_xact_lock_shared(int4, int4)', 'boolean', 'true'],
  ['pg_try_advisory_xact_lock_shared(int8)', 'boolean', 'true'],
  ['pg_advisory_xact_lock(int4, int4)', 'void', ''],
  ['pg_advisory_xact_lock(int8)', 'void', ''],
  ['pg_advisory_xact_lock_shared(int4, int4)', 'void', ''],
  ['pg_advisory_xact_lock_shared(int8)', 'void', ''],
  ['pg_try_advisory_lock(int4, int4)', 'boolean', 'true'],
  ['pg_try_advisory_lock(int8)', 'boolean', 'true'],
  ['pg_try_advisory_lock_shared(int4, int4)', 'boolean', 'true'],
  ['pg_try_advisory_lock_shared(int8)', 'boolean', 'true'],
  ['pg_advisory_lock(int4, int4)', 'void', ''],
  ['pg_advisory_lock(int8)', 'void', ''],
  ['pg_advisory_lock_shared(int4, int4)', 'void', ''],
  ['pg_advisory_lock_shared(int8)', 'void', ''],
  ['pg_advisory_unlock(int4, int4)', 'boolean', 'true'],
  ['pg_advisory_unlock(int8)', 'boolean', 'true'],
  ['pg_advisory_unlock_shared(int4, int4)', 'boolean', 'true'],
  ['pg_advisory_unlock_shared(int8)', 'boolean', 'true'],
] as const;

/**
 * Makes a schema of stubs and a URL whose connections resolve the unqualified advisory-lock
 * names to them (`options=-c search_path=<stub>,pg_catalog`); drops it afterwards.
 */
async function withStubEngine<Tx, Session>(
  f: Fixture<Tx, Session>,
  fn: (stubUrl: string, schema: string) => Promise<void>,
): Promise<void> {
  const schema = `lockkit_stub_${randomBytes(6).toString('hex')}`;
  await f.observer.query(`CREATE SCHEMA ${schema}`);
  try {
    for (const [signature, returns, body] of STUBS) {
      await f.observer.query(
        `CREATE FUNCTION ${schema}.${signature} RETURNS ${returns} LANGUAGE sql AS 'SELECT ${body || 'NULL::void'}'`,
      );
    }
    const url = new URL(f.url);
    url.searchParams.set('options', `-c search_path=${schema},pg_catalog`);
    await fn(url.toString(), schema);
  } finally {
    await f.observer.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
  }
}

/** The schema the unqualified `pg_try_advisory_xact_lock(int4, int4)` resolves to on `executor`. */
async function resolvedSchema(executor: LockExecutor<unknown, unknown>): Promise<unknown> {
  const rows: Row[] = await executor.transaction(({ query }) =>
    query(
      `SELECT p.pronamespace::regnamespace::text AS schema FROM pg_catalog.pg_proc p
        WHERE p.oid = to_regprocedure('pg_try_advisory_xact_lock(int4, int4)')`,
    ),
  );
  return rows[0]?.schema;
}

/** A lock call on the stub engine: it must be refused, and its task must not run. */
async function expectRefused(call: (task: () => Promise<void>) => Promise<unknown>) {
  let ran = false;
  const error = await rejection(
    call(async () => {
      ran = true;
    }),
  );
  expect(ran, 'the task ran on a server whose locks are not real').toBe(false);
  expect(isLockkitError(error) && error.code, String(error)).toBe('ENGINE_LOCKS_NOT_REAL');
  return error as EngineLocksNotRealError;
}

/**
 * The group. `where` says how the adapter reaches the server: the stub cases run only direct
 * (PgBouncer refuses the `options` startup parameter that sets the stub's `search_path`).
 */
export function engineSelfTestCases<Tx, Session>(
  adapter: ConformanceAdapter<Tx, Session>,
  fixture: () => Fixture<Tx, Session>,
  where: 'direct' | 'pgbouncer' = 'direct',
): void {
  caseIt(
    adapter,
    'engine.real-server-passes',
    'on a real server the self-test passes with two sessions (one on a pool of one), and the first lock call runs its task',
    async () => {
      const f = fixture();
      const result = await f.locks.verifyEngine();
      expect(result).toMatchObject({ real: true, method: 'two-sessions' });
      expect(result.server).toMatch(/PostgreSQL/);
      const fresh = createLockClient(f.instance.executor);
      const key = randomKey();
      expect(await fresh.withLock(key, async () => 'ran')).toEqual({
        executed: true,
        result: 'ran',
      });
      // A pool of one cannot open the second session while the first is open: the self-test
      // checks on one session (at once when the executor says so), never hangs.
      const alone = createLockClient(f.newInstance(1).executor);
      expect(await alone.withLock(key, async () => 'ran alone')).toEqual({
        executed: true,
        result: 'ran alone',
      });
      expect(await alone.verifyEngine()).toMatchObject({ real: true, method: 'one-session' });
    },
    20_000,
  );

  caseIt(
    adapter,
    'engine.first-calls-share-one-test',
    'concurrent first calls of one client share one self-test; later calls run none',
    async () => {
      const f = fixture();
      const { executor } = f.instance;
      // Every transaction the client opens: one per lock call, and the self-test's two sessions.
      let transactions = 0;
      const counted = <A extends unknown[], R>(method: ((...args: A) => R) | undefined) =>
        method && {
          value: (...args: A): R => {
            transactions++;
            return method.apply(executor, args);
          },
        };
      const counting = Object.create(executor, {
        transaction: counted(executor.transaction) as PropertyDescriptor,
        ...(executor.pipelinedTransaction && {
          pipelinedTransaction: counted(executor.pipelinedTransaction) as PropertyDescriptor,
        }),
        ...(executor.firstThenBegin && {
          firstThenBegin: counted(executor.firstThenBegin) as PropertyDescriptor,
        }),
      }) as LockExecutor<Tx, Session>;
      const locks = createLockClient(counting);
      const results = await Promise.all(
        Array.from({ length: 5 }, (_, i) => locks.withLock(randomKey(), async () => i)),
      );
      expect(results.map((r) => r.executed)).toEqual([true, true, true, true, true]);
      await locks.withLock(randomKey(), async () => 'again');
      expect(transactions, '6 lock calls and ONE self-test of two sessions').toBe(8);
    },
  );

  if (where !== 'direct') return;

  caseIt(
    adapter,
    'engine.stub-refused',
    'stub advisory-lock functions that answer true and lock nothing: the first lock call rejects ENGINE_LOCKS_NOT_REAL, the task never runs, and the client keeps refusing',
    () =>
      withStubEngine(fixture(), async (stubUrl, schema) => {
        const f = fixture();
        const instance = f.newInstance(3, stubUrl);
        // The stub is what the driver's connections call (the URL's options reached the server).
        expect(await resolvedSchema(instance.executor as LockExecutor<unknown, unknown>)).toBe(
          schema,
        );
        const locks = createLockClient(instance.executor);
        const { namespace, jobKey } = randomKey().names as { namespace: string; jobKey: string };
        const refused = await expectRefused((task) =>
          locks.runExclusiveJob(namespace, jobKey, task),
        );
        expect(refused.found).toMatch(/a second session took the same lock/);
        expect(refused.found).toMatch(/not in pg_locks/);
        expect(refused.server).toMatch(/PostgreSQL/);
        // Refused again, without another self-test, whatever the call.
        await expectRefused((task) => locks.withLock(randomKey(), task));
        if (hasCapability(instance.executor, 'session'))
          await expectRefused((task) => locks.withSessionLock(randomKey(), task));
        await expect(locks.verifyEngine()).rejects.toBeInstanceOf(EngineLocksNotRealError);
      }),
    20_000,
  );

  caseIt(
    adapter,
    'engine.stub-refused-on-one-connection',
    'the same stub behind a pool of one (no second session): the one-session check refuses it too',
    () =>
      withStubEngine(fixture(), async (stubUrl) => {
        const f = fixture();
        const locks = createLockClient(f.newInstance(1, stubUrl).executor);
        const refused = await expectRefused((task) => locks.withLock(randomKey(), task));
        expect(refused.found).toMatch(/not in pg_locks.*checked on one session only/);
      }),
    20_000,
  );
}
