/**
 * node-postgres specifics beyond the conformance suite: connections always go back to the pool
 * (also when BEGIN itself fails), no listener piles up on pooled connections, and a single
 * pg.Client is used by one operation at a time.
 */

import { LockKey } from '@lockkit/core';
import { testDatabaseUrl } from '@lockkit/test-db';
import pg from 'pg';
import { afterEach, describe, expect, it } from 'vitest';
import {
  createLockKit,
  guardCheckouts,
  type PgPoolClientLike,
  type PgPoolLike,
  pgExecutor,
  slotOf,
} from '../src/index.js';

const pools: pg.Pool[] = [];
function newPool(max: number): pg.Pool {
  const pool = new pg.Pool({ connectionString: testDatabaseUrl(), max });
  pool.on('error', () => {});
  pools.push(pool);
  return pool;
}
afterEach(async () => {
  await Promise.all(pools.splice(0).map((p) => p.end()));
});

const key = () => LockKey.fromNames('pg-adapter-test', Math.random().toString(36).slice(2));

describe('pgExecutor over a pg.Pool', () => {
  it('leaves no listener behind on pooled connections after 10,000 operations', async () => {
    const pool = newPool(4);
    const seen = new Set<pg.PoolClient>();
    // The pool as lockkit sees it, noting each connection it hands out.
    const watched: PgPoolLike & { totalCount: number } = {
      get totalCount() {
        return pool.totalCount;
      },
      connect: async () => {
        const client = await pool.connect();
        seen.add(client);
        return client;
      },
    };
    const warnings: Error[] = [];
    const onWarning = (w: Error) => warnings.push(w);
    process.on('warning', onWarning);
    const locks = createLockKit(watched);
    const keys = Array.from({ length: 16 }, key);
    const listeners = () =>
      [...seen].map((c) => c.listenerCount('error') + c.listenerCount('end')).sort();
    await locks.withLock(keys[0] as LockKey, async () => {});
    const baseline = listeners()[0];
    let executed = 0;
    let operations = 0;
    await Promise.all(
      Array.from({ length: 8 }, async (_, lane) => {
        for (let i = 0; i < 1250; i++) {
          const r = await locks.withLock(keys[(lane + i) % keys.length] as LockKey, async () => i);
          operations++;
          if (r.executed) executed++;
        }
      }),
    );
    process.off('warning', onWarning);
    expect(operations).toBe(10_000);
    expect(executed).toBeGreaterThan(0);
    expect(seen.size).toBeGreaterThan(0);
    expect(seen.size).toBeLessThanOrEqual(4);
    // Every connection carries what the pool puts on an idle client and lockkit's one pair, no more.
    expect(new Set(listeners())).toEqual(new Set([baseline]));
    expect(warnings.filter((w) => w.name === 'MaxListenersExceededWarning')).toEqual([]);
    expect(pool.totalCount - pool.idleCount).toBe(0);
  }, 120_000);

  it('returns the connection when BEGIN itself fails, and passes the error on', async () => {
    const pool = newPool(2);
    const released: unknown[] = [];
    const failing: PgPoolLike & { totalCount: number } = {
      get totalCount() {
        return pool.totalCount;
      },
      connect: async () => {
        const client = await pool.connect();
        // Fault injection on a real connection: its first statement (the BEGIN) fails.
        const query = client.query.bind(client) as PgPoolClientLike['query'];
        let first = true;
        const faulty: PgPoolClientLike = {
          query: (text, values) => {
            if (first) {
              first = false;
              return Promise.reject(
                Object.assign(new Error('injected BEGIN failure'), { code: 'XX000' }),
              );
            }
            return query(text, values);
          },
          on: (event: 'error' | 'end', fn: never) => client.on(event, fn),
          release: (error) => {
            released.push(error);
            client.release(error);
          },
        };
        return faulty;
      },
    };
    const locks = createLockKit(failing);
    await expect(locks.withLock(key(), async () => 'never')).rejects.toThrow(
      'injected BEGIN failure',
    );
    await expect(locks.runExclusiveJob('ns', 'job', async () => 'never')).rejects.toThrow(
      'injected BEGIN failure',
    );
    expect(released).toHaveLength(2);
    expect(pool.totalCount - pool.idleCount).toBe(0);
  });

  it('destroys a connection whose backend died instead of reusing it', async () => {
    const pool = newPool(1);
    const locks = createLockKit(pool);
    const pids = new Set<number>();
    await expect(
      locks.withLock(key(), async (client) => {
        const { rows } = await client.query<{ pid: number }>('SELECT pg_backend_pid() AS pid');
        pids.add(rows[0]?.pid as number);
        await client.query('SELECT pg_terminate_backend(pg_backend_pid())');
      }),
    ).rejects.toMatchObject({ code: 'CONNECTION_LOST' });
    const r = await locks.withLock(key(), async (client) => {
      const { rows } = await client.query<{ pid: number }>('SELECT pg_backend_pid() AS pid');
      return rows[0]?.pid as number;
    });
    expect(r.executed && pids.has(r.result)).toBe(false);
    expect(pool.totalCount).toBe(1);
  });

  it('guardCheckouts: a client checked out by someone else survives its backend dying', async () => {
    // What Drizzle does around lockkit's callback: pool.connect(), then its own statements, with
    // no 'error' listener of its own. Without the guard, the 'error' event crashes the process.
    const pool = newPool(2);
    guardCheckouts(pool);
    const crashes: unknown[] = [];
    const onUncaught = (error: unknown) => crashes.push(error);
    process.on('uncaughtException', onUncaught);
    try {
      const client = await pool.connect();
      const { rows } = await client.query<{ pid: number }>('SELECT pg_backend_pid() AS pid');
      const ended = new Promise<void>((resolve) => client.once('end', resolve));
      const observer = new pg.Client({ connectionString: testDatabaseUrl() });
      await observer.connect();
      await observer.query('SELECT pg_terminate_backend($1)', [rows[0]?.pid]);
      await observer.end();
      await ended;
      await expect(client.query('SELECT 1')).rejects.toThrow();
      client.release(true);
      expect(crashes).toEqual([]);
      // Its slot was there all along, and no lease was current: the listeners did nothing else.
      expect(slotOf(client).current).toBeUndefined();
      expect(pool.totalCount).toBe(0);
    } finally {
      process.off('uncaughtException', onUncaught);
    }
  });
});

describe('pgExecutor over one pg.Client', () => {
  it('runs one operation at a time on the client, in call order', async () => {
    const client = new pg.Client({ connectionString: testDatabaseUrl() });
    client.on('error', () => {});
    await client.connect();
    try {
      const locks = createLockKit(client);
      let inFlight = 0;
      let maxInFlight = 0;
      const order: number[] = [];
      const results = await Promise.all(
        Array.from({ length: 6 }, (_, i) =>
          locks.withLock(key(), async (c) => {
            inFlight++;
            maxInFlight = Math.max(maxInFlight, inFlight);
            await c.query('SELECT pg_sleep(0.01)::text');
            order.push(i);
            inFlight--;
            return i;
          }),
        ),
      );
      expect(maxInFlight).toBe(1);
      expect(order).toEqual([0, 1, 2, 3, 4, 5]);
      expect(results.every((r) => r.executed)).toBe(true);
      expect(pgExecutor(client).session).toBeTypeOf('function');
    } finally {
      await client.end();
    }
  });

  it('client.dead: calls on a client whose backend died reject CONNECTION_LOST, not CALLER_TRANSACTION_OPEN', async () => {
    const client = new pg.Client({ connectionString: testDatabaseUrl() });
    client.on('error', () => {});
    await client.connect();
    const admin = new pg.Client({ connectionString: testDatabaseUrl() });
    await admin.connect();
    try {
      const locks = createLockKit(client);
      const first = await locks
        .runExclusiveJob('pg-adapter-test', `dead-${Math.random()}`, async (tx) => {
          const { rows } = await tx.query<{ pid: number }>('SELECT pg_backend_pid() AS pid');
          await admin.query('SELECT pg_terminate_backend($1)', [rows[0]?.pid]);
          await tx.query('SELECT 1');
        })
        .then(
          () => 'resolved',
          (error: { code?: string }) => error.code,
        );
      expect(first).toBe('CONNECTION_LOST');
      const codeOf = (p: Promise<unknown>) =>
        p.then(
          () => 'resolved',
          (error: { code?: string }) => error.code,
        );
      expect(await codeOf(locks.runExclusiveJob('pg-adapter-test', 'after', async () => 1))).toBe(
        'CONNECTION_LOST',
      );
      expect(await codeOf(locks.withSessionLock(key(), async () => 1))).toBe('CONNECTION_LOST');
    } finally {
      await admin.end();
      await client.end().catch(() => {});
    }
  });
});
