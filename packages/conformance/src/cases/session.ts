/**
 * Session-scoped locks: only for adapters with the session capability (a dedicated connection).
 */
import {
  ConnectionLostError,
  createLockClient,
  isLockkitError,
  LockNotHeldError,
  LockTimeoutError,
} from '@lockkit/core';
import { expect } from 'vitest';
import {
  aborted,
  type ConformanceAdapter,
  gate,
  occupyPool,
  randomKey,
  rejection,
  turn,
} from '../harness.js';
import { casesOf, type Fixture } from '../suite.js';

export function sessionCases<Tx, Session>(
  adapter: ConformanceAdapter<Tx, Session>,
  fixture: () => Fixture<Tx, Session>,
): void {
  const test = casesOf(adapter);

  test(
    'session.survives-commit',
    'a session lock outlives transactions the task commits and rolls back, and is released after',
    async () => {
      const f = fixture();
      const key = randomKey();
      const r = await f.locks.withSessionLock(key, async (_session, ctx) => {
        await ctx.query('BEGIN');
        await ctx.query('SELECT 1');
        await ctx.query('COMMIT');
        await ctx.query('BEGIN');
        await ctx.query('ROLLBACK');
        const seen = await f.observer.locksOn(key);
        return seen.map((l) => l.mode);
      });
      expect(r).toEqual({ executed: true, result: ['ExclusiveLock'] });
      expect(await f.observer.locksOn(key)).toEqual([]);
    },
  );

  test(
    'session.reentrant-and-stacking',
    'the holding connection re-acquires (Postgres re-entrancy); lockkit frees every level with the call',
    async () => {
      const f = fixture();
      const key = randomKey();
      const [k1, k2] = key.pair as readonly [number, number];
      await f.locks.withSessionLock(key, async (_session, ctx) => {
        const [again] = await ctx.query('SELECT pg_try_advisory_lock($1::int4, $2::int4) AS ok', [
          k1,
          k2,
        ]);
        expect(again?.ok).toBe(true);
      });
      // The connection goes back to its pool holding nothing of the key: the task's extra level
      // was freed with lockkit's own (a pooled connection must never keep a caller's lock).
      expect(await f.observer.locksOn(key)).toEqual([]);
    },
  );

  test(
    'session.released-on-error',
    'a throwing task gets its error rethrown and the session lock released',
    async () => {
      const f = fixture();
      const key = randomKey();
      const boom = new Error('session task failed');
      const error = await rejection(
        f.locks.withSessionLock(key, async (_s, ctx) => {
          await ctx.query('BEGIN');
          await ctx.query('SELECT 1/0').catch(() => {});
          throw boom;
        }),
      );
      expect(error).toBe(boom);
      expect(await f.observer.locksOn(key)).toEqual([]);
    },
  );

  test(
    'session.blocking',
    'a waiting session acquisition waits, succeeds after release, and times out with LockTimeoutError',
    async () => {
      const f = fixture();
      const key = randomKey();
      const release = gate();
      const holder = f.locks.withSessionLock(key, () => release.promise);
      await f.observer.until(async () => (await f.observer.locksOn(key)).length === 1);
      const timeout = await rejection(
        f.locks.withSessionLock(key, async () => 'no', { wait: true, timeoutMs: 100 }),
      );
      expect(timeout).toBeInstanceOf(LockTimeoutError);
      const waiter = f.locks.withSessionLock(key, async () => 'waited', {
        wait: true,
        timeoutMs: 20_000,
        mode: 'exclusive',
      });
      await f.observer.until(async () => (await f.observer.locksOn(key)).some((l) => !l.granted));
      release.open();
      await holder;
      expect(await waiter).toEqual({ executed: true, result: 'waited' });
    },
  );

  test(
    'session.separate-connections',
    'two concurrent session calls on one key never share a connection: exactly one runs',
    async () => {
      const f = fixture();
      const key = randomKey();
      const both = gate();
      let arrived = 0;
      const results = await Promise.all(
        [0, 1].map(() =>
          f.locks
            .withSessionLock(key, async () => {
              await Promise.race([both.promise, new Promise((r) => setTimeout(r, 300))]);
              return 'ran';
            })
            .then((r) => {
              arrived++;
              if (arrived === 1) both.open();
              return r.executed;
            }),
        ),
      );
      expect(results.sort()).toEqual([false, true]);
    },
  );

  test(
    'session.unlocked-behind-our-back',
    'a lock the task released itself makes the release fail with LockNotHeldError, never silence',
    async () => {
      const f = fixture();
      const key = randomKey();
      const error = await rejection(
        f.locks.withSessionLock(key, (_s, ctx) => ctx.query('SELECT pg_advisory_unlock_all()')),
      );
      expect(error).toBeInstanceOf(LockNotHeldError);
      expect(await f.observer.locksOn(key)).toEqual([]);
    },
  );

  test(
    'session.no-state-leaks',
    "whatever a session task does to its session (settings, custom ones too, the role, another lock, LISTEN, temporary objects, a sequence's lastval, a held cursor, a PREPARE), the next user of the pool never inherits it",
    async () => {
      const f = fixture();
      // A pool of one: the next session is that very connection again, or a new one.
      const locks = createLockClient(f.newInstance(1).executor);
      const other = randomKey();
      const [o1, o2] = other.pair as readonly [number, number];
      const dirtiers: Record<string, string[]> = {
        search_path: ['SET search_path TO pg_catalog'],
        statement_timeout: ['SET statement_timeout = 60000'],
        // Too short for lockkit's own release: the call still tells the task's truth.
        'a 1 ms statement_timeout': ['SET statement_timeout = 1'],
        'a custom setting': ["SET lockkit_conformance.tenant = '42'"],
        'a custom setting through set_config': [
          "SELECT set_config('lockkit_conformance.tenant', '43', false)",
        ],
        role: ['SET ROLE pg_monitor'],
        'session authorization': ['SET SESSION AUTHORIZATION pg_monitor'],
        'another advisory lock': [`SELECT pg_advisory_lock(${o1}, ${o2})`],
        listen: ['LISTEN lockkit_conformance_channel'],
        'temporary table': ['CREATE TEMP TABLE lockkit_conformance_scratch (x int)'],
        lastval: [
          'CREATE TEMP SEQUENCE lockkit_conformance_seq',
          "SELECT nextval('lockkit_conformance_seq')",
        ],
        'holdable cursor': ['DECLARE lockkit_conformance_cursor CURSOR WITH HOLD FOR SELECT 1'],
        prepare: ['PREPARE lockkit_conformance_prepared AS SELECT 1'],
      };
      const state = async () => {
        const r = await locks.withSessionLock(randomKey(), async (_s, ctx) => {
          const [row] = await ctx.query(
            `SELECT current_user AS "user", session_user AS "session", current_setting('search_path') AS path,
                    current_setting('statement_timeout') AS timeout,
                    coalesce(current_setting('lockkit_conformance.tenant', true), '') AS tenant,
                    (SELECT count(*)::int FROM pg_listening_channels()) AS channels,
                    (SELECT count(*)::int FROM pg_class WHERE relnamespace = pg_my_temp_schema()) AS temps,
                    (SELECT count(*)::int FROM pg_cursors WHERE is_holdable) AS cursors,
                    (SELECT count(*)::int FROM pg_prepared_statements WHERE from_sql) AS prepared`,
          );
          // lastval() fails in a session that has called no nextval().
          const lastval = await ctx.query('SELECT lastval() AS v').then(
            (rows) => String(rows[0]?.v),
            () => 'none',
          );
          return { ...row, lastval };
        });
        if (!r.executed) throw new Error('the state probe did not run');
        return r.result;
      };
      const clean = await state();
      expect(clean).toMatchObject({ tenant: '', lastval: 'none', temps: 0, prepared: 0 });
      for (const [what, statements] of Object.entries(dirtiers)) {
        const key = randomKey();
        const r = await locks.withSessionLock(key, async (_s, ctx) => {
          for (const statement of statements) await ctx.query(statement);
          return 'done';
        });
        expect(r, what).toEqual({ executed: true, result: 'done' });
        expect(await f.observer.locksOn(key), what).toEqual([]);
        // A lock the task took on another key and kept goes with the connection lockkit closes:
        // the server frees it when that backend has exited, a moment after the call returned.
        const otherFreed = await f.observer.until(
          async () => (await f.observer.locksOn(other)).length === 0,
        );
        expect(otherFreed, what).toBe(true);
        expect(await state(), what).toEqual(clean);
      }
    },
    60_000,
  );

  test(
    'session.terminated-holder',
    'a terminated session holder: signal fires, ConnectionLostError, another worker takes over',
    async () => {
      const f = fixture();
      const key = randomKey();
      let reason: unknown;
      const error = await rejection(
        f.locks.withSessionLock(key, async (_s, ctx) => {
          const [row] = await ctx.query('SELECT pg_backend_pid() AS pid');
          await f.observer.terminate(Number(row?.pid));
          reason = await aborted(ctx.signal, 10_000);
        }),
      );
      expect(reason).toBeDefined();
      expect(error).toBeInstanceOf(ConnectionLostError);
      const other = createLockClient(f.newInstance(2).executor);
      expect((await other.withSessionLock(key, async () => 1)).executed).toBe(true);
      expect((await f.locks.withSessionLock(randomKey(), async () => 2)).executed).toBe(true);
    },
  );

  test(
    'session.abort-while-queued',
    'a signal aborted while a session call waits for a pooled connection: once it has one and the lock, the task does not start; the call rejects ABORTED and the lock is released',
    async () => {
      const f = fixture();
      const locks = createLockClient(f.newInstance(1).executor, { engineSelfTest: false });
      const release = gate();
      const started = gate();
      const holder = locks.withSessionLock(randomKey(), async () => {
        started.open();
        await release.promise;
      });
      await started.promise;
      const controller = new AbortController();
      const key = randomKey();
      let ran = false;
      const queued = rejection(
        locks.withSessionLock(
          key,
          async () => {
            ran = true;
          },
          { signal: controller.signal },
        ),
      );
      controller.abort(new Error('the caller gave up'));
      release.open();
      expect((await holder).executed).toBe(true);
      const error = await queued;
      expect((error as { code?: string }).code, String(error)).toBe('ABORTED');
      expect(ran).toBe(false);
      expect((await f.locks.withSessionLock(key, async () => 'free')).executed).toBe(true);
    },
  );

  test(
    'session.abort-while-self-test-queued',
    "a new client's first session call, whose engine self-test waits for a pooled connection, is aborted there: it rejects ABORTED at once, not when the pool frees up; the task never starts, the key stays free, and the client's next call runs",
    async () => {
      const f = fixture();
      const pooled = f.newInstance(2).executor;
      const { release, holders } = await occupyPool(pooled, 2, 'session');
      const locks = createLockClient(pooled);
      const controller = new AbortController();
      const key = randomKey();
      let ran = false;
      let settled = false;
      const queued = rejection(
        locks.withSessionLock(
          key,
          async () => {
            ran = true;
          },
          { signal: controller.signal },
        ),
      ).finally(() => {
        settled = true;
      });
      controller.abort(new Error('the caller gave up'));
      await turn();
      try {
        expect(settled, 'the call settled while the pool was still full').toBe(true);
      } finally {
        release.open();
      }
      const error = await queued;
      expect(isLockkitError(error) && error.code, String(error)).toBe('ABORTED');
      for (const holder of holders) expect((await holder).executed).toBe(true);
      expect((await locks.withSessionLock(key, async () => 'next')).executed).toBe(true);
      expect(ran).toBe(false);
      expect(await f.observer.locksOn(key)).toEqual([]);
    },
  );
}
