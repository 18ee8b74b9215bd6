/**
 * Statements of a session lock that the server cancels (57014), each at its own moment.
 *
 * The release: a session task may leave a `statement_timeout` too short for lockkit's own release (on the
 * session, or inside a transaction it left open). Any statement lockkit sends after the task may
 * then be cancelled by the server. Here every one of them is cancelled in turn, on purpose: a
 * real cancel from a real server (the statement is preceded by a `pg_sleep` longer than the
 * task's timeout, so the server raises 57014 at exactly that point, with all its effects on the
 * transaction state), not an error made up by the test. Whatever the point, the call tells the
 * task's truth, the lock is free, and no connection is left in a transaction.
 *
 * The acquire: a timeout on the role (or any cancel) may cancel the try-lock statement after the
 * server took the session lock — a session lock outlives its statement's error. The call fails,
 * and the connection must not go back to the pool holding the lock.
 */

import { testDatabaseBaseUrl } from '@lockkit/test-db';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { LockExecutor, SessionContext } from '../src/executor.js';
import { LockKey } from '../src/keys.js';
import { createLockClient } from '../src/lock.js';
import { sqlState } from '../src/postgres-errors.js';
import { inTransactionFrom } from '../src/ready-status.js';

const APP = 'lockkit-release-cancel';
let observer: pg.Client;
beforeAll(async () => {
  observer = new pg.Client({ connectionString: testDatabaseBaseUrl() });
  await observer.connect();
});
afterAll(async () => {
  await observer.end();
});

const randomKey = () =>
  LockKey.fromNames('release-cancel-test', Math.random().toString(36).slice(2));

/** Backends holding `key`, seen from another session. */
async function holdersOf(key: LockKey): Promise<number[]> {
  const { rows } = await observer.query(
    `SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted
        AND classid = $1::int8::oid AND objid = $2::int8::oid AND objsubid = 2`,
    [key.pgLocks.classid, key.pgLocks.objid],
  );
  return rows.map((r) => Number(r.pid));
}

/** This test's backends that sit in a transaction. */
async function inTransaction(): Promise<number[]> {
  const { rows } = await observer.query(
    `SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND state LIKE 'idle in transaction%'`,
    [APP],
  );
  return rows.map((r) => Number(r.pid));
}

/** Waits (bounded) until no backend of this test is left: a discarded client is closed. */
async function noBackendLeft(): Promise<boolean> {
  for (let i = 0; i < 200; i++) {
    const { rows } = await observer.query(
      'SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = $1',
      [APP],
    );
    if (rows[0].n === 0) return true;
    await new Promise((r) => setTimeout(r, 25));
  }
  return false;
}

/**
 * Lifts the session's statement_timeout for sure. The test's own `SET statement_timeout = 0`, sent
 * while the timeout is 1 ms, is as exposed as lockkit's: on a loaded server its timer fires before
 * it finishes, the SET is cancelled and the 1 ms timeout stays (seen in CI, where every later
 * statement of the release was then cancelled — the test's doing, not the release's). So it is
 * sent again until the server answers it, and checked.
 */
async function liftTimeout(client: pg.Client): Promise<void> {
  for (let attempt = 1; ; attempt++) {
    try {
      await client.query('SET statement_timeout = 0');
      const { rows } = await client.query('SHOW statement_timeout');
      if (rows[0].statement_timeout === '0') return;
    } catch (error) {
      if (sqlState(error) !== '57014' || attempt >= 50) throw error;
    }
  }
}

interface Faults {
  /** Cancel the try-lock statement after the server ran it (the lock taken). */
  cancelLockAfterRun?: boolean;
  /** Statements sent after the task returned, in order. */
  readonly afterTask: string[];
  /** The task has returned: statements from now on are lockkit's release. */
  taskDone: boolean;
  /** Core asked for the connection to be discarded. */
  discarded: boolean;
  /** Advisory locks the backend held when core gave the connection back. */
  heldAtReturn: number;
  /**
   * The timer of the statement that lifts the timeout (`SET statement_timeout = 0`) fires while
   * that statement finishes: the server then cancels the *next* statement before running it, with
   * the timeout already 0 — a real race of a loaded server (seen in CI).
   */
  staleAfterLift?: boolean;
  /** The last statement sent was a lift that the server ran. */
  liftedJustNow: boolean;
  /** How many stale cancels were dealt. */
  staleDealt: number;
}

/**
 * Sessions on a fresh client each, closed when core discards it. `cancelled(n)` says whether the
 * n-th statement after the task is to be cancelled by the server.
 */
function faultyExecutor(
  faults: Faults,
  cancelled: (n: number) => boolean,
  withStatus: boolean,
): LockExecutor<pg.Client, pg.Client> {
  return {
    name: 'release-cancel',
    // Only for lockkit's once-per-client check that the server's locks are real.
    async transaction(fn) {
      const client = new pg.Client({ connectionString: testDatabaseBaseUrl() });
      await client.connect();
      try {
        await client.query('BEGIN');
        const result = await fn({
          query: async (text, params) =>
            (await client.query(text, params ? [...params] : undefined)).rows,
          tx: client,
          signal: new AbortController().signal,
        });
        await client.query('COMMIT');
        return result;
      } finally {
        await client.end();
      }
    },
    async session(fn) {
      const client = new pg.Client({
        connectionString: testDatabaseBaseUrl(),
        application_name: APP,
      });
      await client.connect();
      client.on('error', () => {});
      let discarded = false;
      const query = async (text: string, params?: readonly unknown[]) => {
        if (faults.cancelLockAfterRun && text.includes('pg_try_advisory_lock')) {
          // The statement runs whole (the lock is taken), and its answer is a cancel, as when a
          // role's short timeout ends it just after: the server's own 57014, the lock kept.
          await client.query(text, params ? [...params] : undefined);
          await client.query('SET statement_timeout = 1');
          await client.query('SELECT pg_sleep(0.05)');
        }
        if (faults.taskDone) {
          const n = faults.afterTask.push(text) - 1;
          const afterLift = faults.liftedJustNow;
          faults.liftedJustNow = false;
          if (faults.staleAfterLift && afterLift) {
            // The late timer's cancel, as the server deals it: this statement never runs, its
            // answer is 57014, and the session's timeout stays lifted. Made here with a real
            // statement_timeout on a real sleep (then lifted again), so the error is the server's.
            faults.staleDealt++;
            await client.query('SET statement_timeout = 1');
            const stale = await client.query('SELECT pg_sleep(0.02)').then(
              () => new Error('the stale cancel was not dealt'),
              (error: unknown) => error,
            );
            await liftTimeout(client);
            throw stale;
          }
          if (cancelled(n)) {
            // Longer than the task's 1 ms timeout: the server cancels it, here, for real. Where
            // the timeout is lifted already, or where the server runs nothing but a ROLLBACK (a
            // failed transaction, 25P02), nothing is cancelled, and the statement goes on.
            await client.query('SELECT pg_sleep(0.02)').catch((error: unknown) => {
              if (sqlState(error) !== '25P02') throw error;
            });
          }
        }
        const rows = (await client.query(text, params ? [...params] : undefined)).rows;
        if (faults.taskDone && isLift(text)) faults.liftedJustNow = true;
        return rows;
      };
      const ctx: SessionContext<pg.Client> = {
        query,
        session: client,
        signal: new AbortController().signal,
        backendPid: (client as unknown as { processID?: number }).processID,
        discard: () => {
          discarded = true;
        },
        ...(withStatus ? inTransactionFrom(client) : {}),
      };
      try {
        return await fn(ctx);
      } finally {
        // Every session task ends in a discard: the connection is closed, never lent on.
        faults.discarded = discarded;
        const { rows } = await observer.query(
          `SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND pid = $1`,
          [(client as unknown as { processID?: number }).processID],
        );
        faults.heldAtReturn = rows[0].n;
        await client.end().catch(() => {});
      }
    },
  };
}

/** What the task leaves behind: a short timeout, where lockkit's release must live with it. */
const leftovers: Record<string, readonly string[]> = {
  'a 1 ms statement_timeout on the session': ['SET statement_timeout = 1'],
  'an open transaction with a 1 ms statement_timeout': ['BEGIN', 'SET statement_timeout = 1'],
  'a failed transaction with a 1 ms statement_timeout': [
    'BEGIN',
    'SET statement_timeout = 1',
    'SELECT 1 / 0',
  ],
  // Where the server has JIT, every planned statement (any SELECT) now takes longer than 1 ms to
  // compile: only utility statements (SET, ROLLBACK) can run. Without JIT, as the first one.
  // Compiled and optimized, not inlined: inlining first loads the server's bitcode, ~80-160 ms of
  // server CPU in every new backend (each call here is one), which made these four cases a minute
  // of CI per PostgreSQL 15 pass; the compile alone still takes 2-7 ms a statement here (EXPLAIN
  // ANALYZE's JIT timing), well over the timeout.
  'a 1 ms statement_timeout with JIT compiling every statement': [
    'SET jit = on',
    'SET jit_above_cost = 0',
    'SET jit_inline_above_cost = -1',
    'SET jit_optimize_above_cost = 0',
    'SET statement_timeout = 1',
  ],
};

async function call(
  what: string,
  wait: boolean,
  withStatus: boolean,
  cancelled: (n: number) => boolean,
  cancelLockAfterRun = false,
  staleAfterLift = false,
): Promise<{
  outcome: unknown;
  afterTask: string[];
  key: LockKey;
  discarded: boolean;
  heldAtReturn: number;
  staleDealt: number;
}> {
  const faults: Faults = {
    afterTask: [],
    taskDone: false,
    discarded: false,
    heldAtReturn: 0,
    cancelLockAfterRun,
    staleAfterLift,
    liftedJustNow: false,
    staleDealt: 0,
  };
  const locks = createLockClient(faultyExecutor(faults, cancelled, withStatus));
  const key = randomKey();
  const outcome = await locks
    .withSessionLock(
      key,
      async (_s, ctx) => {
        for (const statement of leftovers[what] ?? []) {
          await ctx.query(statement).catch((error) => {
            // 1 / 0 fails (22012), or the 1 ms timeout cancels it first (57014): aborted either way.
            if (!['22012', '57014'].includes(sqlState(error) ?? '')) throw error;
          });
        }
        faults.taskDone = true;
        return 'done';
      },
      wait ? { wait: true } : {},
    )
    .catch((error: unknown) => ({ rejected: error }));
  return {
    outcome,
    afterTask: faults.afterTask,
    key,
    discarded: faults.discarded,
    heldAtReturn: faults.heldAtReturn,
    staleDealt: faults.staleDealt,
  };
}

/** The release's statement that lifts a timeout the task left. */
const isLift = (statement: string) => /^SET statement_timeout = 0$/i.test(statement);

/** What a call told, for a failure message: its result, or its error's class, code and message. */
function told(outcome: unknown): string {
  if (outcome !== null && typeof outcome === 'object' && 'rejected' in outcome) {
    const error = outcome.rejected as { name?: string; code?: string; message?: string };
    return `rejected: ${error.name ?? '?'} ${error.code ?? ''} ${error.message ?? String(error)}`;
  }
  return `told: ${JSON.stringify(outcome)}`;
}

describe('a session task that left a statement_timeout too short for the release', () => {
  for (const what of Object.keys(leftovers)) {
    for (const wait of [false, true]) {
      for (const withStatus of [false, true]) {
        const label = `${what}, ${wait ? 'wait' : 'try'}, ${withStatus ? 'transaction status known' : 'probed'}`;
        it(`${label}: a cancel at every statement of the release still frees the lock and tells the truth`, async () => {
          // The statements of the release when nothing is cancelled by the test.
          const clean = await call(what, wait, withStatus, () => false);
          const points = clean.afterTask.length;
          expect(clean.outcome).toEqual({ executed: true, result: 'done' });
          expect(points).toBeGreaterThan(0);
          // One cancel at each point, then a cancel at that point and at every one after it
          // until the release has sent twice as many statements as it needs (a server that
          // cancels again and again).
          // And each cancel again, where the statement that then lifts the timeout is itself hit
          // late by its own timer: the statement after the lift is cancelled before it runs.
          const plans: [string, (n: number) => boolean, boolean][] = [];
          for (let k = 0; k < points; k++) {
            plans.push([`cancel at statement ${k}`, (n) => n === k, false]);
            plans.push([
              `cancel at statement ${k} and the next one`,
              (n) => n === k || n === k + 1,
              false,
            ]);
            plans.push([
              `cancel at statement ${k}, then a late cancel on the statement after the lift`,
              (n) => n === k,
              true,
            ]);
          }
          let staleDealt = 0;
          for (const [fault, cancelled, stale] of plans) {
            const replay = `${label}; ${fault}`;
            const r = await call(what, wait, withStatus, cancelled, false, stale);
            staleDealt += r.staleDealt;
            // Where the release lifted the timeout and sent anything after, the late cancel hit it.
            const lifts = r.afterTask.filter((t, i) => isLift(t) && i < r.afterTask.length - 1);
            if (stale) expect(r.staleDealt, replay).toBe(lifts.length > 0 ? 1 : 0);
            expect(
              r.outcome,
              `${replay}; ${told(r.outcome)}; sent: ${r.afterTask.join(' | ')}`,
            ).toEqual({
              executed: true,
              result: 'done',
            });
            expect(r.discarded, replay).toBe(true);
            expect(await holdersOf(r.key), replay).toEqual([]);
            expect(await inTransaction(), replay).toEqual([]);
          }
          // The late cancel was dealt, not only planned, wherever the timeout needs lifting: on
          // the session (a timeout set in a transaction goes with its rollback).
          if (!leftovers[what]?.includes('BEGIN')) expect(staleDealt).toBeGreaterThan(0);
          expect(await noBackendLeft()).toBe(true);
        }, 120_000);
      }
    }
  }
});

describe('a server that cancels every statement of the release', () => {
  it('fails the call, and the discarded connection takes the lock with it', async () => {
    const r = await call('a 1 ms statement_timeout on the session', false, true, () => true);
    expect(r.outcome).toMatchObject({ rejected: { code: 'STATEMENT_TIMEOUT' } });
    // Five unlocks or lifts in a row, all cancelled, then nothing more is sent.
    expect(r.afterTask.length).toBe(6);
    expect(r.discarded).toBe(true);
    expect(await noBackendLeft()).toBe(true);
    expect(await holdersOf(r.key)).toEqual([]);
  });
});

describe('a try-lock statement cancelled after the server took the lock', () => {
  it('fails the call, and the connection does not go back to the pool holding the lock', async () => {
    const r = await call('a 1 ms statement_timeout on the session', false, true, () => false, true);
    expect(r.outcome).toMatchObject({ rejected: { code: 'STATEMENT_TIMEOUT' } });
    // Closed (discarded), or handed back holding nothing.
    expect(
      r.discarded || r.heldAtReturn === 0,
      `held ${r.heldAtReturn}, discarded ${r.discarded}`,
    ).toBe(true);
    expect(await noBackendLeft()).toBe(true);
    expect(await holdersOf(r.key)).toEqual([]);
  });
});
