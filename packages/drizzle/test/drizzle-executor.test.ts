/**
 * Drizzle specifics: nested transactions are savepoints (a lock taken in one that rolls back is
 * released), parameters are bound by Drizzle, and the result shapes of both drivers are read. On a
 * node-postgres pool lockkit checks the connection out itself: the task still gets Drizzle's own
 * transaction, made with the database's configuration.
 */
import { isLockkitError, LockKey, UnsupportedCapabilityError } from '@lockkit/core';
import { testDatabaseUrl } from '@lockkit/test-db';
import { is, sql } from 'drizzle-orm';
import { drizzle } from 'drizzle-orm/node-postgres';
import { PgTransaction } from 'drizzle-orm/pg-core';
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

  it("refuses a Drizzle transaction in place of the database at creation, saying what to pass (lockkit's transaction would be a savepoint of the caller's, its lock held until the caller's ends)", async () => {
    const { instance } = setup();
    const db = instance.db as unknown as {
      transaction<T>(fn: (tx: unknown) => Promise<T>): Promise<T>;
    };
    const seen = await db.transaction(async (tx) => {
      try {
        createLockKit(tx as never);
        return { code: 'accepted', message: '' };
      } catch (error) {
        return {
          code: isLockkitError(error) ? error.code : String(error),
          message: (error as Error).message,
        };
      }
    });
    expect(seen.code).toBe('OPTION_INVALID');
    expect(seen.message).toMatch(/transaction/);
    expect(seen.message).toMatch(/database/);
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

/** A pool that stays quiet when a connection it holds dies, closed after the test. */
function pool(max: number): pg.Pool {
  const made = new pg.Pool({ connectionString: testDatabaseUrl(), max });
  made.on('error', () => {});
  closers.push(() => made.end());
  return made;
}

describe('Drizzle on postgres.js: the transaction client lockkit guards', () => {
  it("still takes every form of postgres.js's unsafe(): (text), (text, parameters), (text, parameters, options), (text, options)", async () => {
    const instance = postgresJsInstance(testDatabaseUrl(), 2);
    closers.push(instance.close);
    const locks = createLockKit(instance.db as never) as ReturnType<typeof createLockKit>;
    const r = await locks.withLock(LockKey.fromNames('drizzle-unsafe', 'forms'), async (tx) => {
      // The client Drizzle's own queries go through (lockkit guards it; see executor.ts).
      const client = (
        tx as unknown as {
          session: { client: { unsafe(...args: unknown[]): Promise<Record<string, unknown>[]> } };
        }
      ).session.client;
      const rows = await Promise.all([
        client.unsafe('SELECT 1 AS n'),
        client.unsafe('SELECT $1::int AS n', [2]),
        client.unsafe('SELECT $1::int AS n', [3], { prepare: false }),
        client.unsafe('SELECT 4 AS n', { prepare: false }),
      ]);
      return rows.map((r) => Number(r[0]?.n));
    });
    expect(r).toEqual({ executed: true, result: [1, 2, 3, 4] });
  });
});

describe('Drizzle on a node-postgres pool (lockkit checks the connection out)', () => {
  it("gives the task Drizzle's own transaction, logged by the database's logger, and releases the connection", async () => {
    const logged: string[] = [];
    const p = pool(2);
    const db = drizzle(p, { logger: { logQuery: (query) => logged.push(query) } });
    const locks = createLockKit(db);
    const r = await locks.withLock(
      LockKey.fromNames('drizzle-test', `own-checkout-${Math.random()}`),
      async (tx) => {
        await tx.execute(sql`SELECT 'from the task'`);
        return {
          drizzleTransaction: is(tx, PgTransaction),
          checkedOut: p.totalCount - p.idleCount,
        };
      },
    );
    expect(r).toEqual({ executed: true, result: { drizzleTransaction: true, checkedOut: 1 } });
    expect(logged).toContain('begin');
    expect(logged).toContain("SELECT 'from the task'");
    expect(p.totalCount - p.idleCount).toBe(0);
  });

  it('never hands on a connection a protocol cancel was sent on (a pool of one, an aborted wait)', async () => {
    const holderPool = pool(1);
    const holder = createLockKit(drizzle(holderPool));
    const alone = createLockKit(drizzle(pool(1)));
    const admin = new pg.Client({ connectionString: testDatabaseUrl() });
    await admin.connect();
    closers.push(() => admin.end());
    const backend = async () => {
      const r = await alone.withLock(
        LockKey.fromNames('drizzle-test', `pid-${Math.random()}`),
        async (_tx, ctx) => (await ctx.query('SELECT pg_backend_pid() AS pid'))[0]?.pid,
      );
      return r.executed ? r.result : undefined;
    };
    const before = await backend();
    const key = LockKey.fromNames('drizzle-test', `cancelled-${Math.random()}`);
    let letGo!: () => void;
    const held = new Promise<void>((resolve) => {
      letGo = resolve;
    });
    let holding!: () => void;
    const isHeld = new Promise<void>((resolve) => {
      holding = resolve;
    });
    const holderRun = holder.withLock(key, async () => {
      holding();
      await held;
    });
    await isHeld;
    const controller = new AbortController();
    const waiter = alone
      .withLock(key, async () => 'ran', { wait: true, signal: controller.signal })
      .catch((error: { code?: string }) => error.code);
    // The waiter's wait is visible in pg_locks: only then does the abort cancel a statement.
    const { objid } = key.pgLocks;
    for (;;) {
      const { rows } = await admin.query(
        "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND objid = $1::int8::oid",
        [objid],
      );
      if (rows.length > 0) break;
      await new Promise<void>((resolve) => setImmediate(resolve));
    }
    controller.abort(new Error('caller gave up'));
    expect(await waiter).toBe('ABORTED');
    letGo();
    await holderRun;
    const after = await backend();
    expect(before).toEqual(expect.any(Number));
    expect(after).toEqual(expect.any(Number));
    expect(
      after,
      'the cancelled connection was destroyed, a new one serves the next call',
    ).not.toBe(before);
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
