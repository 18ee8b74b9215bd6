/**
 * Many lock calls given one `signal` (a scheduler's stop signal under a backlog of ticks, an
 * application's shutdown signal passed to every call): Node's EventTarget compares each new
 * listener with every listener the signal already has, so a listener per call costs O(N²) in all
 * — at 80,000 waiting calls, most of a millisecond for each new one. Lockkit keeps at most one
 * listener on a caller's signal, however many of its calls wait on it, and each call still
 * answers the abort at once.
 */

import { getEventListeners } from 'node:events';
import { testDatabaseBaseUrl } from '@lockkit/test-db';
import pg from 'pg';
import { afterAll, describe, expect, it } from 'vitest';
import { isLockkitError } from '../src/errors.js';
import { LockKey } from '../src/keys.js';
import { createLockClient } from '../src/lock.js';
import { poolExecutor } from './client-executor.js';

const pools: pg.Pool[] = [];
afterAll(async () => {
  await Promise.all(pools.map((p) => p.end()));
});
function poolOf(max: number): pg.Pool {
  const pool = new pg.Pool({ connectionString: testDatabaseBaseUrl(), max });
  pool.on('error', () => {});
  pools.push(pool);
  return pool;
}
const key = (name: string) =>
  LockKey.fromNames('shared-signal-test', `${name}-${Math.random().toString(36).slice(2)}`);
const listeners = (signal: AbortSignal) => getEventListeners(signal, 'abort').length;

describe('one signal shared by many waiting calls', () => {
  it('calls waiting for a pooled connection keep one listener on it, and all leave at its abort', async () => {
    const pool = poolOf(1);
    const locks = createLockClient(poolExecutor(pool));
    // The once-per-client check that the server's locks are real, out of the way first.
    expect((await locks.withLock(key('warm'), () => 'ok')).executed).toBe(true);
    const held = await pool.connect();
    const controller = new AbortController();
    const calls = Array.from({ length: 300 }, (_, i) =>
      locks
        .withLock(key(`c${i}`), () => 'ran', { signal: controller.signal })
        .then(
          () => 'settled',
          (error: unknown) => error,
        ),
    );
    await new Promise((r) => setImmediate(r));
    let outcomes: unknown[];
    try {
      expect(listeners(controller.signal)).toBeLessThanOrEqual(1);
      controller.abort();
      outcomes = await Promise.all(calls);
    } finally {
      held.release();
    }
    expect(outcomes.every((o) => isLockkitError(o) && o.code === 'ABORTED')).toBe(true);
    // The abandoned asks settle once the pool lends the connection; none runs its task.
    expect((await locks.withLock(key('after'), () => 'ok')).executed).toBe(true);
  });

  it('calls waiting for a held lock keep one listener on it, and all are cancelled at its abort', async () => {
    const n = 8;
    // The holder, the waiters, and room for the cancels (this executor has no protocol cancel).
    const pool = poolOf(2 * n + 1);
    const locks = createLockClient(poolExecutor(pool));
    const k = key('held');
    const holder = await pool.connect();
    try {
      const [a, b] = k.pair as readonly [number, number];
      await holder.query('SELECT pg_advisory_lock($1, $2)', [a, b]);
      expect((await locks.withLock(key('warm'), () => 'ok')).executed).toBe(true);
      const controller = new AbortController();
      const waiting = Array.from({ length: n }, () =>
        locks
          .withLock(k, () => 'ran', { wait: true, signal: controller.signal })
          .then(
            () => 'settled',
            (error: unknown) => error,
          ),
      );
      // Every waiter is in its lock wait on the server.
      for (let i = 0; i < 400; i++) {
        const { rows } = await holder.query(
          `SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
              AND classid = $1::int8::oid AND objid = $2::int8::oid AND objsubid = 2`,
          [k.pgLocks.classid, k.pgLocks.objid],
        );
        if (rows[0].n === n) break;
        await new Promise((r) => setTimeout(r, 25));
      }
      expect(listeners(controller.signal)).toBeLessThanOrEqual(1);
      controller.abort();
      const outcomes = await Promise.all(waiting);
      expect(outcomes.every((o) => isLockkitError(o) && o.code === 'ABORTED')).toBe(true);
    } finally {
      await holder.query('SELECT pg_advisory_unlock_all()');
      holder.release();
    }
  });

  it("tasks that read their signal add no listener each to the caller's", async () => {
    const pool = poolOf(20);
    const locks = createLockClient(poolExecutor(pool));
    const controller = new AbortController();
    let release!: () => void;
    const gate = new Promise<void>((r) => {
      release = r;
    });
    let started = 0;
    let allStarted!: () => void;
    const running = new Promise<void>((r) => {
      allStarted = r;
    });
    const calls = Array.from({ length: 20 }, (_, i) =>
      locks.withLock(
        key(`t${i}`),
        async (_tx, ctx) => {
          ctx.signal.addEventListener('abort', () => {});
          if (++started === 20) allStarted();
          await gate;
          return 'ran';
        },
        { signal: controller.signal },
      ),
    );
    await running;
    try {
      expect(listeners(controller.signal)).toBeLessThanOrEqual(1);
    } finally {
      release();
    }
    expect((await Promise.all(calls)).every((r) => r.executed)).toBe(true);
  });
});
