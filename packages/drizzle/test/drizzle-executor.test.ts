/**
 * Drizzle specifics: nested transactions are savepoints (a lock taken in one that rolls back is
 * released), parameters are bound by Drizzle, and the result shapes of both drivers are read.
 */
import { LockKey, UnsupportedCapabilityError } from '@lockkit/core';
import { testDatabaseUrl } from '@lockkit/test-db';
import { sql } from 'drizzle-orm';
import { drizzle } from 'drizzle-orm/node-postgres';
import pg from 'pg';
import { afterEach, describe, expect, it } from 'vitest';
import { createLockKit, toDrizzleSql } from '../src/index.js';
import { nodePostgresInstance, postgresJsInstance } from './instances.js';

const closers: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  await Promise.all(closers.splice(0).map((close) => close()));
});

describe('toDrizzleSql', () => {
  it('turns $n placeholders into bound parameters, repeated ones included', () => {
    const query = toDrizzleSql('SELECT $1::int4 AS a, $2::text AS b, $1::int4 AS c', [7, 'x']);
    const chunks = (query as unknown as { queryChunks: unknown[] }).queryChunks;
    expect(chunks.length).toBeGreaterThan(0);
  });
});

describe.each([
  ['node-postgres', nodePostgresInstance],
  ['postgres.js', postgresJsInstance],
] as const)('Drizzle on %s', (_driver, make) => {
  const setup = () => {
    const instance = make(testDatabaseUrl(), 4);
    closers.push(instance.close);
    return {
      instance,
      locks: createLockKit(instance.db as never) as ReturnType<typeof createLockKit>,
    };
  };

  it('binds parameters through Drizzle and reads its result shape', async () => {
    const { locks } = setup();
    const r = await locks.withLock(LockKey.fromBigInt(-(2n ** 63n)), async (_tx, ctx) => {
      const [row] = await ctx.query('SELECT $1::int8::text AS v, $2::text AS s', [
        '-9223372036854775808',
        "it's",
      ]);
      return row;
    });
    expect(r).toEqual({ executed: true, result: { v: '-9223372036854775808', s: "it's" } });
  });

  it('releases a lock taken inside a nested transaction (savepoint) that rolls back', async () => {
    const { locks } = setup();
    const outer = LockKey.fromNames('drizzle-test', `outer-${Math.random()}`);
    const inner = LockKey.fromNames('drizzle-test', `inner-${Math.random()}`);
    const [i1, i2] = inner.pair as readonly [number, number];
    const held = (tx: { execute(q: ReturnType<typeof sql>): Promise<unknown> }) =>
      tx.execute(
        sql`SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()
              AND objid = ${inner.pgLocks.objid}::int8::oid`,
      );
    const r = await locks.withLock(outer, async (tx) => {
      const t = tx as unknown as {
        transaction<T>(fn: (inner: typeof tx) => Promise<T>): Promise<T>;
        execute(q: ReturnType<typeof sql>): Promise<unknown>;
      };
      await t
        .transaction(async (nested) => {
          await (nested as typeof t).execute(
            sql`SELECT pg_advisory_xact_lock(${i1}::int4, ${i2}::int4)`,
          );
          const during = await held(nested as typeof t);
          expect(JSON.stringify(during)).toContain('1');
          throw new Error('roll the savepoint back');
        })
        .catch((error: Error) => expect(error.message).toBe('roll the savepoint back'));
      return held(t);
    });
    expect(r.executed).toBe(true);
    if (r.executed) expect(JSON.stringify(r.result)).toContain('"n":0');
  });

  it('terminate.query-after-loss: a Drizzle query after the backend died rejects CONNECTION_LOST, never crashes or hangs', async () => {
    const { locks } = setup();
    const admin = new pg.Client({ connectionString: testDatabaseUrl() });
    await admin.connect();
    closers.push(() => admin.end());
    const outcome = await locks
      .withLock(
        LockKey.fromNames('drizzle-test', `terminate-${Math.random()}`),
        async (tx, ctx) => {
          const t = tx as unknown as { execute(q: ReturnType<typeof sql>): Promise<unknown> };
          const [row] = await ctx.query('SELECT pg_backend_pid() AS pid');
          const lost = new Promise<void>((resolve) =>
            ctx.signal.addEventListener('abort', () => resolve(), { once: true }),
          );
          await admin.query('SELECT pg_terminate_backend($1)', [row?.pid]);
          // Gate: lockkit knows the connection is gone; the task queries on anyway.
          await lost;
          await t.execute(sql`SELECT 1`);
          return 'done';
        },
      )
      .then(
        () => 'resolved',
        (error: { code?: string }) => error.code,
      );
    expect(outcome).toBe('CONNECTION_LOST');
  }, 15_000);
});

describe('Drizzle on a single pg.Client', () => {
  it('has no session capability: session calls fail at once with a typed error naming it', async () => {
    const client = new pg.Client({ connectionString: testDatabaseUrl() });
    client.on('error', () => {});
    await client.connect();
    closers.push(() => client.end());
    const locks = createLockKit(drizzle(client));
    expect(locks.executor.session).toBeUndefined();
    const error = await locks
      .withSessionLock(LockKey.fromPair(1, 2), async () => 1)
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(UnsupportedCapabilityError);
    expect((error as UnsupportedCapabilityError).adapter).toBe('drizzle');
    // Transactions still work, taking turns on the one connection.
    const results = await Promise.all(
      [1, 2, 3].map((i) => locks.withLock(LockKey.fromPair(3, i), async () => i)),
    );
    expect(results).toEqual([1, 2, 3].map((i) => ({ executed: true, result: i })));
  });
});
