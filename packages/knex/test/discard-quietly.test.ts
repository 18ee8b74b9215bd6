/**
 * A session connection lockkit discards after a session lock leaves Knex's pool without a word in
 * Knex's log: discarding it is lockkit's normal work, not a connection error. Knex's pool still
 * never hands it out again, and counts it neither used nor free afterwards.
 */
import { randomBytes } from 'node:crypto';
import { LockKey } from '@lockkit/core';
import { testDatabaseUrl } from '@lockkit/test-db';
import knex from 'knex';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLockKit } from '../src/index.js';

const key = () => LockKey.fromNames('lockkit-knex-quiet', randomBytes(8).toString('hex'));

/** Everything Knex logs, by level. */
const logged: string[] = [];
const record =
  (level: string) =>
  (message: unknown): void => {
    logged.push(`${level}: ${String(message)}`);
  };
/** Marks this pool's backends in pg_stat_activity. */
const applicationName = `lockkit_knex_quiet_${randomBytes(4).toString('hex')}`;
function marked(url: string): string {
  const u = new URL(url);
  u.searchParams.set('application_name', applicationName);
  return u.toString();
}
const db = knex({
  client: 'pg',
  connection: marked(testDatabaseUrl()),
  pool: { min: 0, max: 2 },
  log: {
    warn: record('warn'),
    error: record('error'),
    debug: record('debug'),
    deprecate: record('deprecate'),
  },
});
const locks = createLockKit(db);

interface TarnCounts {
  numUsed(): number;
  numFree(): number;
  numPendingCreates(): number;
  numPendingAcquires(): number;
}
const pool = () => db.client.pool as TarnCounts;

/** An observer outside Knex's pool. */
const observer = new pg.Client({ connectionString: testDatabaseUrl() });

/** This pool's backends the server still has. */
async function liveBackends(): Promise<number[]> {
  const { rows } = await observer.query<{ pid: number }>(
    'SELECT pid FROM pg_stat_activity WHERE application_name = $1 ORDER BY pid',
    [applicationName],
  );
  return rows.map((row) => row.pid);
}

beforeAll(async () => {
  await observer.connect();
});

afterAll(async () => {
  await db.destroy();
  await observer.end();
});

describe('a session connection discarded after a session lock', () => {
  it('leaves the pool silently, is never handed out again, and is counted nowhere', async () => {
    const first = await locks.withSessionLock(key(), async (conn) => conn.processID);
    expect(first.executed).toBe(true);
    const sessionPid = first.executed ? first.result : undefined;
    expect(typeof sessionPid).toBe('number');
    // The server closed that session (its locks with it), and the pool counts it no more: what
    // it holds free is exactly the connections still open.
    const live = await liveBackends();
    expect(live).not.toContain(sessionPid);
    expect(pool().numUsed()).toBe(0);
    expect(pool().numFree()).toBe(live.length);
    // The next calls get other connections, and Knex logs nothing on the way.
    const second = await locks.withSessionLock(key(), async (conn) => conn.processID);
    expect(second.executed && second.result).not.toBe(sessionPid);
    const tx = await locks.withLock(key(), async (trx) => {
      const { rows: r } = await trx.raw('SELECT pg_backend_pid() AS pid');
      return r[0].pid as number;
    });
    expect(tx.executed && tx.result).not.toBe(sessionPid);
    expect(logged).toEqual([]);
    expect(pool().numUsed()).toBe(0);
    expect(pool().numFree()).toBe((await liveBackends()).length);
    expect(pool().numPendingAcquires()).toBe(0);
  });
});

describe('a pool of one whose only connection is discarded', () => {
  it('lends a new connection to the borrower that waited for it', async () => {
    const single = knex({
      client: 'pg',
      connection: testDatabaseUrl(),
      pool: { min: 0, max: 1 },
      // A borrower left waiting fails in 5 s instead of Knex's 60.
      acquireConnectionTimeout: 5000,
      log: { warn: record('warn'), error: record('error'), debug: record('debug') },
    });
    try {
      const singlePool = single.client.pool as TarnCounts & {
        on(event: 'acquireRequest', listener: () => void): void;
      };
      let waiting!: () => void;
      const borrowerWaits = new Promise<void>((resolve) => {
        waiting = resolve;
      });
      const borrowed: Promise<number>[] = [];
      const session = createLockKit(single).withSessionLock(key(), async (conn) => {
        // The task holds the pool's only connection: another borrower queues behind it.
        singlePool.on('acquireRequest', () => waiting());
        borrowed.push(
          single.raw('SELECT pg_backend_pid() AS pid').then(({ rows }) => rows[0].pid as number),
        );
        await borrowerWaits;
        expect(singlePool.numPendingAcquires()).toBe(1);
        return conn.processID;
      });
      const done = await session;
      expect(done.executed).toBe(true);
      const pid = await borrowed[0];
      expect(pid).not.toBe(done.executed && done.result);
      expect([singlePool.numUsed(), singlePool.numFree()]).toEqual([0, 1]);
      expect(logged).toEqual([]);
    } finally {
      await single.destroy();
    }
  });
});

describe("Knex's destroy() while a session lock's connection is lent", () => {
  it('resolves once the session call has ended and its connection left the pool', async () => {
    const closing = knex({ client: 'pg', connection: testDatabaseUrl(), pool: { min: 0, max: 2 } });
    let release!: () => void;
    const gate = new Promise<void>((resolve) => {
      release = resolve;
    });
    let running!: () => void;
    const started = new Promise<void>((resolve) => {
      running = resolve;
    });
    const session = createLockKit(closing).withSessionLock(key(), async () => {
      running();
      await gate;
      return 'done';
    });
    await started;
    // Tarn's destroy waits for every lent connection to come back (or leave).
    const destroyed = closing.destroy();
    release();
    expect(await session).toEqual({ executed: true, result: 'done' });
    await destroyed;
    expect(closing.client.pool).toBeUndefined();
  }, 15_000);
});
