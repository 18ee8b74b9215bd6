/**
 * postgres.js specifics beyond the conformance suite: parameters reach the server as the right
 * types with prepare on and off, and a dead reserved connection never crashes the process.
 */
import { startRoundTripProxy } from '@lockkit/conformance';
import { LockKey } from '@lockkit/core';
import { testDatabaseUrl } from '@lockkit/test-db';
import pg from 'pg';
import postgres from 'postgres';
import { afterEach, describe, expect, it } from 'vitest';
import { createLockKit } from '../src/index.js';

const instances: postgres.Sql[] = [];
afterEach(async () => {
  await Promise.all(instances.splice(0).map((sql) => sql.end({ timeout: 5 })));
});

describe.each([true, false])('postgres.js with prepare: %s', (prepare) => {
  const newSql = () => {
    const sql = postgres(testDatabaseUrl(), { max: 4, prepare, onnotice: () => {} });
    instances.push(sql);
    return sql;
  };

  it('sends int4 pairs and int8 keys intact, as int4 and int8, to the lock functions', async () => {
    const locks = createLockKit(newSql());
    const keys = [
      LockKey.fromPair(-(2 ** 31), 2 ** 31 - 1),
      LockKey.fromBigInt(-(2n ** 63n)),
      LockKey.fromBigInt(2n ** 63n - 1n),
      LockKey.fromBigInt(9_007_199_254_740_993n), // not representable as a JS number
    ];
    for (const key of keys) {
      const r = await locks.withLock(key, async (_tx, ctx) => {
        const [types] = await ctx.query(
          key.pair
            ? 'SELECT pg_typeof($1::int4)::text AS a, pg_typeof($2::int4)::text AS b'
            : 'SELECT pg_typeof($1::int8)::text AS a, $1::int8::text AS value',
          key.pair ? [...key.pair] : [String(key.int8)],
        );
        const [held] = await ctx.query(
          `SELECT classid::text, objid::text, objsubid::int AS objsubid FROM pg_locks
            WHERE locktype = 'advisory' AND pid = pg_backend_pid()`,
        );
        return { types, held };
      });
      expect(r.executed).toBe(true);
      if (!r.executed) continue;
      expect(r.result.types).toEqual(
        key.pair ? { a: 'integer', b: 'integer' } : { a: 'bigint', value: String(key.int8) },
      );
      expect(LockKey.fromPgLocks(r.result.held as never).equals(key)).toBe(true);
    }
  });

  it('survives a backend terminated while the task is idle, and the instance keeps working', async () => {
    const sql = newSql();
    const locks = createLockKit(sql);
    const admin = new pg.Client({ connectionString: testDatabaseUrl() });
    await admin.connect();
    try {
      const outcome = await locks
        .withLock(LockKey.fromNames('pjs', `idle-${prepare}`), async (tx, ctx) => {
          const [row] = await ctx.query('SELECT pg_backend_pid() AS pid');
          await admin.query('SELECT pg_terminate_backend($1)', [row?.pid]);
          // The loss may be known already (the signal then fires no more 'abort' event).
          await new Promise<void>((resolve) => {
            if (ctx.signal.aborted) resolve();
            else ctx.signal.addEventListener('abort', () => resolve());
          });
          // The user's handle refuses to send on the dead connection instead of crashing.
          expect(() => tx`SELECT 1`).toThrow();
          return 'done';
        })
        .then(
          () => 'resolved',
          (error: { code?: string }) => error.code,
        );
      expect(outcome).toBe('CONNECTION_LOST');
      const again = await Promise.all(
        Array.from({ length: 6 }, (_, i) =>
          locks.runExclusiveJob('pjs', `after-${prepare}-${i}`, async (tx) => {
            const [row] = await tx`SELECT 1 AS one`;
            return row?.one;
          }),
        ),
      );
      expect(again.every((r) => r.executed && r.result === 1)).toBe(true);
    } finally {
      await admin.end();
    }
  });

  /**
   * Terminates the task's backend, then queries on the task's handle once the gate (installed
   * after the executor's own close hook) opens.
   */
  async function queryAfterTerminate(
    sql: postgres.Sql,
    gate: (sql: postgres.Sql) => () => Promise<void>,
  ) {
    const locks = createLockKit(sql);
    const ready = gate(sql);
    const admin = new pg.Client({ connectionString: testDatabaseUrl() });
    await admin.connect();
    try {
      return await locks
        .withLock(LockKey.fromNames('pjs', `terminate-${Math.random()}`), async (tx) => {
          const [row] = await tx.unsafe('SELECT pg_backend_pid() AS pid');
          await admin.query('SELECT pg_terminate_backend($1)', [row?.pid]);
          await ready();
          await tx.unsafe('SELECT 1');
          return 'done';
        })
        .then(
          () => 'resolved',
          (error: { code?: string }) => error.code,
        );
    } finally {
      await admin.end();
    }
  }

  it('terminate.query-at-once: a query sent as the backend dies rejects CONNECTION_LOST, never hangs', async () => {
    expect(await queryAfterTerminate(newSql(), () => async () => {})).toBe('CONNECTION_LOST');
  }, 15_000);

  it('terminate.query-after-close: a query sent after postgres.js closed the socket, before anyone checked, rejects CONNECTION_LOST, never crashes', async () => {
    // Gate: postgres.js has closed the connection (the watch's check has only started).
    const afterClose = (sql: postgres.Sql) => {
      const options = sql.options as { onclose?: ((id: number) => void) | null };
      const hook = options.onclose;
      const closeSeen = new Promise<void>((resolve) => {
        options.onclose = (id: number) => {
          hook?.(id);
          resolve();
        };
      });
      return () => closeSeen;
    };
    expect(await queryAfterTerminate(newSql(), afterClose)).toBe('CONNECTION_LOST');
  }, 15_000);

  it('session.reset-link-cut: the link cut as the session reset goes out after a session lock was released: the call settles executed (the task ran, its unlock was answered), never hangs or crashes, and the next call runs (fault-point group, with-session-lock-try / drop-before at the reset)', async () => {
    const proxy = await startRoundTripProxy(testDatabaseUrl());
    try {
      const locks = createLockKit(
        (() => {
          const sql = postgres(proxy.url, { max: 1, prepare, onnotice: () => {} });
          instances.push(sql);
          return sql;
        })(),
        { engineSelfTest: false },
      );
      const key = LockKey.fromNames('lockkit-postgres-test', `reset-cut-${String(prepare)}`);
      await locks.withSessionLock(key, async () => 'warm');
      // Where the reset travels among the call's statements: recorded, not assumed.
      const recorder = proxy.record();
      await locks.withSessionLock(key, async () => 'recorded');
      const reset = recorder.stop().findIndex((s) => s.text.startsWith('CLOSE ALL'));
      expect(reset).toBeGreaterThan(0);
      const trap = proxy.trapStatement(reset, 'drop-before');
      // A bound on a hang (the bug: the call never settled), not a synchronisation.
      let watchdog: ReturnType<typeof setTimeout> | undefined;
      const outcome = await Promise.race([
        locks
          .withSessionLock(key, async () => 'ran')
          .then(
            (r) => JSON.stringify(r),
            (error: unknown) => String((error as { code?: unknown }).code),
          ),
        new Promise((resolve) => {
          watchdog = setTimeout(() => resolve('hung'), 5000);
        }),
      ]);
      clearTimeout(watchdog);
      await trap.fired;
      expect(outcome).toBe('{"executed":true,"result":"ran"}');
      expect(await locks.withSessionLock(key, async () => 'next')).toEqual({
        executed: true,
        result: 'next',
      });
    } finally {
      await proxy.close();
    }
  }, 20_000);
});

describe('postgres.js with max: 1', () => {
  it('abort.queued: aborting a wait cancels only that wait, never ends the connection an unrelated queued query gets', async () => {
    const sql = postgres(testDatabaseUrl(), { max: 1, onnotice: () => {} });
    instances.push(sql);
    const locks = createLockKit(sql);
    const admin = new pg.Client({ connectionString: testDatabaseUrl() });
    await admin.connect();
    const classid = 2_000_000 + Math.floor(Math.random() * 1_000_000);
    try {
      await admin.query('SELECT pg_advisory_lock($1::int4, 1)', [classid]);
      const controller = new AbortController();
      const waiting = locks
        .withLock(LockKey.fromPair(classid, 1), async () => 'ran', {
          wait: true,
          timeoutMs: 30_000,
          signal: controller.signal,
        })
        .then(
          () => 'ran',
          (error: { code?: string }) => error.code,
        );
      // Gate on the server: the waiter's backend is blocked on the key.
      let waiterPid: number | undefined;
      while (waiterPid === undefined) {
        const { rows } = await admin.query<{ pid: number }>(
          `SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND classid = $1 AND NOT granted`,
          [classid],
        );
        waiterPid = rows[0]?.pid;
      }
      // The only connection is reserved by the wait: this query queues behind it.
      const queued = sql`SELECT pg_backend_pid() AS pid`.then(
        (rows) => Number(rows[0]?.pid),
        (error: { code?: string }) => `failed ${error.code}`,
      );
      controller.abort();
      expect(await waiting).toBe('ABORTED');
      // The same backend serves it: the cancelled wait's connection was not ended.
      expect(await queued).toBe(waiterPid);
    } finally {
      await admin.query('SELECT pg_advisory_unlock_all()');
      await admin.end();
    }
  });
});

describe('postgres.js handles lockkit cannot use', () => {
  it('executor.transaction-sql: a TransactionSql (inside sql.begin) is refused EXECUTOR_INVALID, before any SQL', async () => {
    const sql = postgres(testDatabaseUrl(), { max: 1, onnotice: () => {} });
    instances.push(sql);
    const code = await sql.begin(async (tx) => {
      try {
        createLockKit(tx as never);
        return 'accepted';
      } catch (error) {
        return (error as { code?: string }).code ?? String(error);
      }
    });
    expect(code).toBe('EXECUTOR_INVALID');
  });
});
