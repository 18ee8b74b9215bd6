/**
 * Behind a transaction-pooling PgBouncer: the hazard is real, and lockkit refuses session scope
 * there — when the user declares the pooler, and when it detects one on its own.
 */
import { createLockClient, hasCapability, UnsafeBehindPoolerError } from '@lockkit/core';
import pg from 'pg';
import { expect, it } from 'vitest';
import { type ConformanceAdapter, randomKey, rejection } from '../harness.js';
import { caseIt, type Fixture } from '../suite.js';

export function poolerCases<Tx, Session>(
  adapter: ConformanceAdapter<Tx, Session>,
  fixture: () => Fixture<Tx, Session>,
  bouncer: {
    readonly url: string;
    readonly singleConnectionUrl: string;
    readonly sessionModeUrl?: string;
  },
): void {
  caseIt(
    adapter,
    'pooler.hazard-reproduced',
    'a session lock taken through PgBouncer is inherited by the next, unrelated client',
    async () => {
      const f = fixture();
      const key = randomKey();
      const [k1, k2] = key.pair as readonly [number, number];
      const a = new pg.Client({ connectionString: bouncer.singleConnectionUrl });
      const b = new pg.Client({ connectionString: bouncer.singleConnectionUrl });
      a.on('error', () => {});
      b.on('error', () => {});
      await a.connect();
      await b.connect();
      try {
        await a.query('SELECT pg_advisory_lock($1::int4, $2::int4)', [k1, k2]);
        // Client b never asked for the lock, yet its statement runs on the server connection that
        // holds it — and "acquires" it again, re-entrantly, while a believes it has it alone.
        const { rows } = await b.query<{ inherited: boolean; again: boolean }>(
          `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory'
                           AND classid = $1::int8::oid AND objid = $2::int8::oid AND objsubid = 2) AS inherited,
                  pg_try_advisory_lock($3::int4, $4::int4) AS again`,
          [key.pgLocks.classid, key.pgLocks.objid, k1, k2],
        );
        expect(rows[0]).toEqual({ inherited: true, again: true });
      } finally {
        await a.query('SELECT pg_advisory_unlock_all()');
        await Promise.all([a.end(), b.end()]);
      }
      expect(await f.observer.locksOn(key)).toEqual([]);
    },
  );

  // Without a session capability there is no session scope to refuse: the refusal cases are moot.
  const probe = adapter.createInstance({ url: bouncer.url || 'postgres://unused', poolSize: 1 });
  const hasSession = hasCapability(probe.executor, 'session');
  void probe.close();
  if (!hasSession) {
    for (const id of [
      'pooler.session-refused-when-declared',
      'pooler.session-refused-when-detected',
      'pooler.session-mode-allowed',
    ]) {
      it.skip(`${id}: skipped — the ${adapter.name} executor has no session capability to refuse`, () => {});
    }
    return;
  }

  caseIt(
    adapter,
    'pooler.session-refused-when-declared',
    'a declared transaction pooler: session scope fails before any SQL with UnsafeBehindPoolerError',
    async () => {
      const f = fixture();
      const locks = createLockClient(f.newInstance(2, f.url, true).executor);
      const key = randomKey();
      let ran = false;
      const error = await rejection(
        locks.withSessionLock(key, async () => {
          ran = true;
        }),
      );
      expect(error).toBeInstanceOf(UnsafeBehindPoolerError);
      expect((error as UnsafeBehindPoolerError).reason).toBe('declared');
      expect(ran).toBe(false);
      expect(await f.observer.locksOn(key)).toEqual([]);
      // Transaction scope stays available through the same executor.
      expect((await locks.withLock(key, async () => 'ok')).executed).toBe(true);
    },
  );

  caseIt(
    adapter,
    'pooler.session-refused-when-detected',
    'an undeclared PgBouncer is detected: session scope fails, no lock is left on any server connection',
    async () => {
      const f = fixture();
      const locks = createLockClient(f.newInstance(2, f.url, false).executor);
      const key = randomKey();
      let ran = false;
      const error = await rejection(
        locks.withSessionLock(key, async () => {
          ran = true;
        }),
      );
      expect(error).toBeInstanceOf(UnsafeBehindPoolerError);
      expect((error as UnsafeBehindPoolerError).reason).toBe('detected');
      expect(ran).toBe(false);
      expect(await f.observer.locksOn(key)).toEqual([]);
      // Remembered: the next session call is refused at once.
      await expect(locks.withSessionLock(randomKey(), async () => 1)).rejects.toBeInstanceOf(
        UnsafeBehindPoolerError,
      );
    },
  );

  const sessionModeUrl = bouncer.sessionModeUrl;
  if (!sessionModeUrl) {
    it.skip('pooler.session-mode-allowed: skipped — no session-mode PgBouncer was given', () => {});
    return;
  }
  caseIt(
    adapter,
    'pooler.session-mode-allowed',
    'through PgBouncer in session mode, session locks work: taken on the client’s own backend, excluding others, released after',
    async () => {
      const f = fixture();
      const tagged = new URL(sessionModeUrl);
      tagged.searchParams.set('application_name', f.applicationName);
      const locks = createLockClient(f.newInstance(3, tagged.toString(), false).executor);
      const key = randomKey();
      for (let i = 0; i < 2; i++) {
        const r = await locks.withSessionLock(key, async (_session, ctx) => {
          const [row] = await ctx.query('SELECT pg_backend_pid() AS pid');
          expect((await f.observer.locksOn(key)).map((l) => l.pid)).toEqual([Number(row?.pid)]);
          // Another client of the same pool is excluded, not let in by a shared server connection.
          expect((await locks.withSessionLock(key, async () => 'second')).executed).toBe(false);
          return 'ran';
        });
        expect(r).toMatchObject({ executed: true, result: 'ran' });
        expect(await f.observer.locksOn(key)).toEqual([]);
      }
    },
  );
}
