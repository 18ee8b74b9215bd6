/**
 * Telling a session-mode pooler (session locks safe) from a transaction-mode one (session locks
 * unsafe), against real PgBouncers in both modes and a direct connection.
 */

import { testDatabaseBaseUrl, testPgBouncer } from '@lockkit/test-db';
import pg from 'pg';
import { afterEach, describe, expect, it } from 'vitest';
import { UnsafeBehindPoolerError } from '../src/errors.js';
import type { LockExecutor } from '../src/executor.js';
import { LockKey } from '../src/keys.js';
import { createLockClient } from '../src/lock.js';
import { detectPooler } from '../src/session-pinning.js';
import { poolExecutor } from './client-executor.js';

const bouncer = testPgBouncer();
const pools: pg.Pool[] = [];
afterEach(async () => {
  await Promise.all(pools.splice(0).map((p) => p.end()));
});
function poolOf(url: string, max = 3): pg.Pool {
  const pool = new pg.Pool({ connectionString: url, max });
  pool.on('error', () => {});
  pools.push(pool);
  return pool;
}
const randomKey = () => LockKey.fromNames('pooler-test', Math.random().toString(36).slice(2));

/** Advisory locks on `key` seen from a direct connection: the backends that hold it. */
async function holdersOf(key: LockKey): Promise<number[]> {
  const observer = new pg.Client({ connectionString: testDatabaseBaseUrl() });
  await observer.connect();
  try {
    const { rows } = await observer.query(
      `SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted
          AND classid = $1::int8::oid AND objid = $2::int8::oid AND objsubid = 2`,
      [key.pgLocks.classid, key.pgLocks.objid],
    );
    return rows.map((r) => Number(r.pid));
  } finally {
    await observer.end();
  }
}

describe('detectPooler()', () => {
  it('finds a direct connection direct', async () => {
    expect(await detectPooler(poolExecutor(poolOf(testDatabaseBaseUrl())))).toEqual({
      kind: 'direct',
    });
  });

  it.runIf('url' in bouncer)('finds PgBouncer in session mode safe for session locks', async () => {
    const { sessionModeUrl } = bouncer as { sessionModeUrl: string };
    expect(await detectPooler(poolExecutor(poolOf(sessionModeUrl)))).toEqual({
      kind: 'session-pooler',
    });
  });

  it.runIf('url' in bouncer)('finds PgBouncer in transaction mode unsafe, saying why', async () => {
    const { url } = bouncer as { url: string };
    const verdict = await detectPooler(poolExecutor(poolOf(url)));
    expect(verdict.kind).toBe('transaction-pooler');
    expect((verdict as { evidence: string }).evidence).toMatch(/backend \d+/);
  });

  it.runIf('url' in bouncer)(
    'cannot verify a pooler with a single connection to spare, and says so',
    async () => {
      const { sessionModeUrl } = bouncer as { sessionModeUrl: string };
      const verdict = await detectPooler(poolExecutor(poolOf(sessionModeUrl, 1)), {
        probeTimeoutMs: 300,
      });
      expect(verdict).toMatchObject({
        kind: 'unverified',
        reason: expect.stringMatching(/second connection/),
      });
    },
  );
});

describe('withSessionLock() behind PgBouncer', () => {
  it.runIf('url' in bouncer)(
    'takes and releases a session lock through session mode, on the client’s own backend',
    async () => {
      const { sessionModeUrl } = bouncer as { sessionModeUrl: string };
      const locks = createLockClient(poolExecutor(poolOf(sessionModeUrl)));
      const key = randomKey();
      for (let i = 0; i < 2; i++) {
        const r = await locks.withSessionLock(key, async (_session, ctx) => {
          const [row] = await ctx.query('SELECT pg_backend_pid() AS pid');
          expect(await holdersOf(key)).toEqual([Number(row?.pid)]);
          return 'ran';
        });
        expect(r).toEqual({ executed: true, result: 'ran' });
        expect(await holdersOf(key)).toEqual([]);
      }
    },
  );

  it.runIf('url' in bouncer)('refuses it through transaction mode, taking no lock', async () => {
    const { url } = bouncer as { url: string };
    const locks = createLockClient(poolExecutor(poolOf(url)));
    const key = randomKey();
    let ran = false;
    const error = await locks
      .withSessionLock(key, async () => {
        ran = true;
      })
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(UnsafeBehindPoolerError);
    expect((error as UnsafeBehindPoolerError).reason).toBe('detected');
    expect((error as Error).message).toMatch(/transaction/);
    expect(ran).toBe(false);
    expect(await holdersOf(key)).toEqual([]);
  });
});

describe('the detection message', () => {
  it.runIf('url' in bouncer)(
    'names the pid the driver was given as the driver’s, and the server’s backend as the server’s',
    async () => {
      // PgBouncer 1.18 invents negative pids for half its clients; pin that case down.
      const { url } = bouncer as { url: string };
      const real = poolExecutor(poolOf(url));
      const executor: LockExecutor = {
        name: 'negative-pid',
        transaction: real.transaction,
        session: (fn) =>
          (real.session as NonNullable<LockExecutor['session']>)((ctx) =>
            fn({ ...ctx, backendPid: -1442101390 }),
          ),
      };
      const error = await createLockClient(executor)
        .withSessionLock(randomKey(), async () => 1)
        .catch((e: unknown) => e);
      expect(error).toBeInstanceOf(UnsafeBehindPoolerError);
      const message = (error as Error).message;
      expect(message).toMatch(/driver was given backend pid -1442101390 at connect/);
      expect(message).not.toMatch(/backend \(not a server pid\)/);
      expect(message).toMatch(/server runs .*backend \d+/);
    },
  );
});
