/**
 * Bad input, fuzzed: every public entry point given invalid arguments answers with a typed
 * `LockkitError` (a `LockKeyError` for keys) — and sends no SQL at all (no connection is even
 * checked out of the pool), so no row of lockkit's tables can change. Against a real server, so a
 * validation that slipped past the client would show up as a query.
 */
import { randomBytes } from 'node:crypto';
import {
  createLockClient,
  createScheduler,
  doctor,
  generateLockKeys,
  inspect,
  isLockkitError,
  LockKey,
  LockKeyError,
  type LockkitError,
  migrate,
} from '@lockkit/core';
import { testDatabaseUrl } from '@lockkit/test-db';
import fc from 'fast-check';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLockKit, pgExecutor } from '../src/index.js';

let pool: pg.Pool;
let checkouts = 0;
const schema = `lockkit_fuzz_${randomBytes(4).toString('hex')}`;
let snapshot: () => Promise<string>;

beforeAll(async () => {
  pool = new pg.Pool({ connectionString: testDatabaseUrl(), max: 2 });
  await createLockKit(pool, { schema }).migrate();
  const locks = createLockKit(pool, { schema });
  await locks.runWithLease('fuzz', 'existing', async () => {}, { ttlMs: 10_000 });
  snapshot = async () => {
    const { rows } = await pool.query(
      `SELECT (SELECT coalesce(json_agg(l ORDER BY namespace, job_key), '[]') FROM "${schema}".leases l)::text
           || (SELECT coalesce(json_agg(r ORDER BY job, tick), '[]') FROM "${schema}".runs r)::text AS state`,
    );
    return rows[0].state as string;
  };
  pool.on('acquire', () => checkouts++);
});
afterAll(async () => {
  await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
  await pool.end();
});

/** Anything that is not a usable key name. */
const badName = fc.oneof(
  fc.constant(''),
  fc.constant(undefined),
  fc.constant(null),
  fc.integer(),
  fc.boolean(),
  fc.object(),
  fc.array(fc.string()),
  fc.string({ minLength: 1025, maxLength: 1500 }), // over MAX_KEY_NAME_BYTES (1024)
  fc.constantFrom('\ud800', 'a\udc00b', 'é'.repeat(513)), // 1,026 UTF-8 bytes in 513 characters
);
/** Anything that is not an int4. */
const badInt4 = fc.oneof(
  fc.double().filter((n) => !Number.isInteger(n)),
  fc.integer({ min: 2 ** 31, max: Number.MAX_SAFE_INTEGER }),
  fc.integer({ min: Number.MIN_SAFE_INTEGER, max: -(2 ** 31) - 1 }),
  fc.constantFrom(Number.NaN, Number.POSITIVE_INFINITY, '1', null, undefined, 1n),
);
/** Option bags with at least one invalid value. */
const badLockOptions = fc.oneof(
  fc.record({ wait: fc.constantFrom('yes', 1, 'false') }),
  fc.record({ timeoutMs: fc.constantFrom(-1, 1.5, Number.NaN, '100') }),
  fc.record({
    wait: fc.constant(true),
    timeoutMs: fc.constantFrom(-5, Number.POSITIVE_INFINITY, 'x'),
  }),
  fc.record({ mode: fc.constantFrom('EXCLUSIVE', 'read', 1) }),
  fc.record({ signal: fc.constantFrom('abort', {}, 1) }),
  fc.record({ statementTimeoutMs: fc.constantFrom(-1, 0.5, 'ten') }),
  fc.record({ idleInTransactionTimeoutMs: fc.constantFrom(-1, 2 ** 40, 'x') }),
);
const badLeaseOptions = fc.oneof(
  fc.record({ ttlMs: fc.constantFrom(0, -1, 1.5, Number.NaN, '1000', 2 ** 40) }),
  fc.record({ owner: fc.constantFrom('', 'x'.repeat(201), 7) }),
  fc.record({ renewEveryMs: fc.constantFrom(0, -3, 'x') }),
  fc.record({ heartbeat: fc.constantFrom('no', 0) }),
  fc.record({ signal: fc.constantFrom('abort', {}) }),
);
// (null and undefined mean "not set": the default schema.)
const badSchema = fc.oneof(
  fc.constantFrom(
    '',
    '1abc',
    'a-b',
    'a b',
    'a;DROP TABLE x',
    '"quoted"',
    'x'.repeat(64),
    'ünïcode',
  ),
  fc.constantFrom(1, {}, true),
);

/** Runs `call`, which must fail with a typed error, and checks that no connection was used. */
async function refusedWithoutSql(call: () => unknown): Promise<LockkitError> {
  const before = checkouts;
  let caught: unknown;
  try {
    await call();
  } catch (error) {
    caught = error;
  }
  expect(caught, 'the call must fail').toBeDefined();
  expect(isLockkitError(caught), `a LockkitError, got ${String(caught)}`).toBe(true);
  expect(checkouts - before, 'no connection may be checked out').toBe(0);
  return caught as LockkitError;
}

const untyped = (v: unknown) => v as never;
const task = async () => 'ran';

describe('fuzzed bad input: typed errors, no SQL, no state change', () => {
  it('key constructors', async () => {
    await fc.assert(
      fc.asyncProperty(badName, badName, async (namespace, jobKey) => {
        const e = await refusedWithoutSql(() =>
          LockKey.fromNames(untyped(namespace), untyped(jobKey)),
        );
        expect(e).toBeInstanceOf(LockKeyError);
        await refusedWithoutSql(() => generateLockKeys(untyped(namespace), 'job'));
      }),
    );
    await fc.assert(
      fc.asyncProperty(
        badInt4,
        fc.integer({ min: -(2 ** 31), max: 2 ** 31 - 1 }),
        async (bad, ok) => {
          expect(await refusedWithoutSql(() => LockKey.fromPair(untyped(bad), ok))).toBeInstanceOf(
            LockKeyError,
          );
          expect(await refusedWithoutSql(() => LockKey.fromPair(ok, untyped(bad)))).toBeInstanceOf(
            LockKeyError,
          );
        },
      ),
    );
    await fc.assert(
      fc.asyncProperty(
        fc.oneof(
          fc.bigInt({ min: 2n ** 63n }),
          fc.bigInt({ max: -(2n ** 63n) - 1n }),
          fc.constantFrom(1, '5', null),
        ),
        async (bad) => {
          await refusedWithoutSql(() => LockKey.fromBigInt(untyped(bad)));
        },
      ),
    );
    await fc.assert(
      fc.asyncProperty(
        fc.record({
          locktype: fc.constantFrom('advisory', 'relation', null),
          classid: fc.oneof(fc.integer({ min: -5, max: -1 }), fc.constantFrom(2 ** 32, 'x', 1.5)),
          objid: fc.integer({ min: 0, max: 2 ** 32 - 1 }),
          objsubid: fc.constantFrom(0, 3, 2),
        }),
        async (row) => {
          await refusedWithoutSql(() => LockKey.fromPgLocks(untyped(row)));
        },
      ),
    );
  });

  it('lock operations', async () => {
    const locks = createLockKit(pool, { schema });
    const before = await snapshot();
    await fc.assert(
      fc.asyncProperty(badName, async (name) => {
        await refusedWithoutSql(() => locks.runExclusiveJob(untyped(name), 'job', task));
        await refusedWithoutSql(() => locks.runExclusiveJob('ns', untyped(name), task));
        await refusedWithoutSql(() => locks.runWithLease(untyped(name), 'job', task));
        await refusedWithoutSql(() =>
          locks.withFencedWrite(untyped({ namespace: name, jobKey: 'j', token: 1n }), task),
        );
        await refusedWithoutSql(() =>
          locks.withFencedWrite(untyped({ namespace: 'ns', jobKey: name, token: 1n }), task),
        );
      }),
      { numRuns: 60 },
    );
    const key = LockKey.fromNames('fuzz', 'key');
    await fc.assert(
      fc.asyncProperty(badLockOptions, async (options) => {
        await refusedWithoutSql(() => locks.withLock(key, task, untyped(options)));
      }),
      { numRuns: 60 },
    );
    await fc.assert(
      fc.asyncProperty(badLeaseOptions, async (options) => {
        await refusedWithoutSql(() =>
          locks.runWithLease('fuzz', 'existing', task, untyped(options)),
        );
      }),
      { numRuns: 40 },
    );
    await fc.assert(
      fc.asyncProperty(
        fc.constantFrom(null, 'task', 1, {}),
        fc.constantFrom('not a key', null, {}, 5),
        async (badTask, badKey) => {
          await refusedWithoutSql(() => locks.withLock(key, untyped(badTask)));
          await refusedWithoutSql(() => locks.withLock(untyped(badKey), task));
          await refusedWithoutSql(() => locks.withSessionLock(untyped(badKey), task));
          await refusedWithoutSql(() => locks.runWithLease('fuzz', 'existing', untyped(badTask)));
          await refusedWithoutSql(() =>
            locks.withFencedWrite(
              { namespace: 'fuzz', jobKey: 'existing', token: 1n },
              untyped(badTask),
            ),
          );
          await refusedWithoutSql(() =>
            locks.withFencedWrite(
              untyped({ namespace: 'fuzz', jobKey: 'existing', token: badKey }),
              task,
            ),
          );
        },
      ),
      { numRuns: 20 },
    );
    expect(await snapshot()).toBe(before);
  });

  it('schemas, clients, scheduler registration, inspection', async () => {
    const before = await snapshot();
    await fc.assert(
      fc.asyncProperty(badSchema, async (bad) => {
        await refusedWithoutSql(() => createLockKit(pool, { schema: untyped(bad) }));
        await refusedWithoutSql(() => migrate(pgExecutor(pool), { schema: untyped(bad) }));
        await refusedWithoutSql(() => inspect(pgExecutor(pool), { schema: untyped(bad) }));
      }),
      { numRuns: 30 },
    );
    await fc.assert(
      fc.asyncProperty(fc.constantFrom(null, {}, { transaction: 1 }, 'pool', 3), async (bad) => {
        await refusedWithoutSql(() => createLockClient(untyped(bad)));
      }),
      { numRuns: 10 },
    );
    const scheduler = createScheduler(createLockKit(pool, { schema }));
    await fc.assert(
      fc.asyncProperty(
        fc.oneof(
          fc.record({ name: badName, cron: fc.constant('* * * * * *'), options: fc.constant({}) }),
          fc.record({
            name: fc.constant('ok-name'),
            cron: fc.constantFrom('', '61 * * * *', 'every minute', '* * * * * * * *', 5),
            options: fc.constant({}),
          }),
          fc.record({
            name: fc.constant('ok-name'),
            cron: fc.constant('* * * * *'),
            options: fc.oneof(
              fc.record({ mode: fc.constantFrom('session', 1) }),
              fc.record({ timezone: fc.constantFrom('Mars/Olympus', 5) }),
              fc.record({ retries: fc.constantFrom(-1, 1.5, 'two') }),
              fc.record({ catchUp: fc.constantFrom('all', { withinMs: -1 }, 3) }),
              fc.record({ overlap: fc.constantFrom('parallel', 2) }),
              fc.record({ jitterMs: fc.constantFrom(-1, Number.NaN) }),
            ),
          }),
        ),
        async ({ name, cron, options }) => {
          await refusedWithoutSql(() =>
            scheduler.register(untyped(name), untyped(cron), task, untyped(options)),
          );
        },
      ),
      { numRuns: 80 },
    );
    for (const bad of [null, {}, 'executor']) {
      await refusedWithoutSql(() => doctor(untyped(bad)));
      await refusedWithoutSql(() => inspect(untyped(bad)));
      await refusedWithoutSql(() => migrate(untyped(bad)));
    }
    expect(await snapshot()).toBe(before);
  });
});
