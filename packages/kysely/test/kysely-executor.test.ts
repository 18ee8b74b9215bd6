/**
 * Kysely specifics, on a real PostgreSQL: parameters travel as Kysely's bound parameters, the
 * session's startup pid is the pinned connection's (not another connection the task takes from the
 * same pool meanwhile), and the pool whose `connect()` lockkit wraps still serves everyone else.
 */
import { randomBytes } from 'node:crypto';
import { isLockkitError, type LockClient, LockKey } from '@lockkit/core';
import { testDatabaseUrl } from '@lockkit/test-db';
import { startHeldGoodbyeProxy } from '@lockkit/test-db/held-goodbye-proxy';
import { Kysely, PostgresDialect, sql } from 'kysely';
import pg from 'pg';
import { afterEach, describe, expect, it } from 'vitest';
import { createLockKit } from '../src/index.js';
import { kyselyInstance, type TestDatabase } from './instances.js';

const closers: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  await Promise.all(closers.splice(0).map((close) => close()));
});

const setup = (poolSize = 4) => {
  const instance = kyselyInstance(testDatabaseUrl(), poolSize);
  closers.push(instance.close);
  return { instance, locks: createLockKit(instance.db, { pool: instance.pool }) };
};

const key = () => LockKey.fromNames('kysely-test', randomBytes(6).toString('hex'));

/** A session call whose task only notes that it ran: what it settled with (or threw), and whether it ran. */
async function trySession(locks: Pick<LockClient<unknown, unknown>, 'withSessionLock'>) {
  let ran = false;
  const outcome = await locks
    .withSessionLock(key(), async () => {
      ran = true;
    })
    .then(
      (r) => r,
      (e: unknown) => e,
    );
  return { outcome, ran };
}

describe('@lockkit/kysely', () => {
  it('binds parameters through Kysely, int8 and quotes included', async () => {
    const { locks } = setup();
    const r = await locks.withLock(LockKey.fromBigInt(-(2n ** 63n)), async (_trx, ctx) => {
      const [row] = await ctx.query('SELECT $1::int8::text AS v, $2::text AS s', [
        '-9223372036854775808',
        "it's",
      ]);
      return row;
    });
    expect(r).toEqual({ executed: true, result: { v: '-9223372036854775808', s: "it's" } });
  });

  it("reports the pinned connection's startup pid, not that of another connection the task takes", async () => {
    const { instance } = setup();
    const { executor } = instance;
    if (executor.session === undefined) throw new Error('no session capability');
    const seen = await executor.session(async (ctx) => {
      // The task's own query on the outer db: another pooled connection, asked for from inside
      // the session's async context.
      const other = await sql<{ pid: number }>`SELECT pg_backend_pid() AS pid`.execute(instance.db);
      const [own] = await ctx.query('SELECT pg_backend_pid() AS pid');
      ctx.discard?.();
      return { other: other.rows[0]?.pid, own: Number(own?.pid), reported: ctx.backendPid };
    });
    expect(seen.reported).toBe(seen.own);
    expect(seen.other).not.toBe(seen.own);
  });

  it("leaves the pool's connect() working for everyone else: promise and callback forms", async () => {
    const { instance, locks } = setup();
    expect((await locks.withSessionLock(key(), async () => 'ran')).executed).toBe(true);
    const viaPromise = await instance.pool.connect();
    const { rows } = await viaPromise.query<{ one: number }>('SELECT 1 AS one');
    viaPromise.release();
    expect(rows).toEqual([{ one: 1 }]);
    const viaCallback = await new Promise<number>((resolve, reject) => {
      instance.pool.connect(
        (error: Error | undefined, client?: pg.PoolClient, done?: () => void) => {
          if (error || !client) return reject(error);
          client.query<{ two: number }>('SELECT 2 AS two').then((result) => {
            done?.();
            resolve(result.rows[0]?.two ?? 0);
          }, reject);
        },
      );
    });
    expect(viaCallback).toBe(2);
  });

  it('refuses a Transaction in place of the Kysely instance at creation, saying what to pass', async () => {
    const { instance } = setup();
    const seen = await instance.db.transaction().execute(async (trx) => {
      try {
        createLockKit(trx, { pool: instance.pool });
        return { code: 'accepted', message: '' };
      } catch (error) {
        return {
          code: isLockkitError(error) ? error.code : String(error),
          message: (error as Error).message,
        };
      }
    });
    expect(seen.code).toBe('OPTION_INVALID');
    expect(seen.message).toMatch(/Transaction/);
    expect(seen.message).toMatch(/Kysely instance/);
  });

  it("refuses a session when the pool option is not the dialect's pool, before the task runs", async () => {
    // A Kysely no lockkit client has seen, and another pool given as its pool: lockkit would see
    // none of the session's connections, so neither a transaction pooler's startup pid nor the
    // pinned connection to close.
    const pool = new pg.Pool({ connectionString: testDatabaseUrl(), max: 4 });
    const db = new Kysely<TestDatabase>({ dialect: new PostgresDialect({ pool }) });
    const other = new pg.Pool({ connectionString: testDatabaseUrl(), max: 4 });
    closers.push(
      () => db.destroy(),
      () => other.end(),
    );
    const locks = createLockKit(db, { pool: other });
    const { outcome, ran } = await trySession(locks);
    expect(outcome).toMatchObject({ code: 'OPTION_INVALID' });
    expect(ran).toBe(false);
  });

  it('refuses a session with neither the pool option nor transactionPooler: false, before the task runs', async () => {
    // Without the pool lockkit cannot see the startup pid that gives PgBouncer away: behind an
    // undeclared transaction pooler, tasks of one session lock would run side by side. The caller
    // must give the pool, or say there is no pooler.
    const pool = new pg.Pool({ connectionString: testDatabaseUrl(), max: 2 });
    const db = new Kysely<TestDatabase>({ dialect: new PostgresDialect({ pool }) });
    closers.push(() => db.destroy());
    const { outcome, ran } = await trySession(createLockKit(db));
    expect(outcome).toMatchObject({ code: 'OPTION_INVALID' });
    expect(String((outcome as Error).message)).toMatch(/transactionPooler: false/);
    expect(ran).toBe(false);
    // Said in so many words, the session runs.
    const declared = await createLockKit(db, { transactionPooler: false }).withSessionLock(
      key(),
      async () => 'ran',
    );
    expect(declared).toMatchObject({ executed: true, result: 'ran' });
  });

  it('closes a session connection after the task, and returns only once its locks are gone', async () => {
    const { instance, locks } = setup(1);
    const observer = new pg.Client({ connectionString: testDatabaseUrl() });
    await observer.connect();
    closers.push(() => observer.end());
    const other = key();
    const [o1, o2] = other.pair as readonly [number, number];
    const before = await sql<{ pid: number }>`SELECT pg_backend_pid() AS pid`.execute(instance.db);
    const r = await locks.withSessionLock(key(), async (_session, ctx) => {
      // Another session lock, taken behind lockkit's back: only closing the connection frees it.
      await ctx.query(`SELECT pg_advisory_lock(${o1}, ${o2})`);
      const [row] = await ctx.query('SELECT pg_backend_pid() AS pid');
      return Number(row?.pid);
    });
    // At once, from outside: the closed session's backend has exited, its lock with it.
    const held = await observer.query<{ n: number }>(
      `SELECT count(*)::int AS n FROM pg_locks
        WHERE locktype = 'advisory' AND classid = $1::int8::oid AND objid = $2::int8::oid`,
      [other.pgLocks.classid, other.pgLocks.objid],
    );
    expect(held.rows[0]?.n).toBe(0);
    expect(r.executed).toBe(true);
    if (!r.executed) return;
    // A pool of one: the session ran on the pool's only connection, which was then replaced.
    const after = await sql<{ pid: number }>`SELECT pg_backend_pid() AS pid`.execute(instance.db);
    expect(r.result).toBe(before.rows[0]?.pid);
    expect(after.rows[0]?.pid).not.toBe(r.result);
  });
  it('runs the next call on a fresh connection when the pooled one lost its backend a moment ago, before the pool saw it close', async () => {
    // The pool of one holds a connection whose backend is terminated while the proxy holds back
    // the server's FATAL and hang-up: the pool lends it as live, Kysely's BEGIN goes nowhere, and
    // only then does the client hear. Nothing of the call had reached the server: it begins again.
    const proxy = await startHeldGoodbyeProxy(testDatabaseUrl());
    closers.push(proxy.close);
    const instance = kyselyInstance(proxy.url, 1);
    closers.push(instance.close);
    const locks = createLockKit(instance.db, { pool: instance.pool });
    const admin = new pg.Client({ connectionString: testDatabaseUrl() });
    await admin.connect();
    closers.push(() => admin.end());
    const backend = async (trx: Kysely<TestDatabase>) =>
      (await sql<{ pid: number }>`SELECT pg_backend_pid() AS pid`.execute(trx)).rows[0]?.pid;
    const first = await locks.runExclusiveJob('kysely-test', 'dead-start', backend);
    expect(first.executed).toBe(true);
    const { clientSpoke } = proxy.hold();
    await proxy.terminateBackends((text, params) => admin.query(text, params));
    const next = locks.runExclusiveJob('kysely-test', 'dead-start', backend);
    await clientSpoke;
    proxy.release();
    const outcome = await next.catch((error: unknown) => error);
    expect(outcome).toMatchObject({ executed: true });
    expect((outcome as { result: number }).result).not.toBe(first.executed && first.result);
    expect(instance.checkedOut()).toBe(0);
  });
});

describe('a pool of one, transaction scope', () => {
  it("the task's signal fires when its backend is terminated while the task runs", async () => {
    // The dead-backend check asks the server through the pool, whose only connection the dead
    // transaction still holds: the signal must come from the connection's own close instead.
    const { locks } = setup(1);
    const admin = new pg.Client({ connectionString: testDatabaseUrl() });
    await admin.connect();
    closers.push(() => admin.end());
    let pidOf!: (pid: number) => void;
    const pid = new Promise<number>((resolve) => {
      pidOf = resolve;
    });
    let fired = false;
    const call = locks
      .withLock(key(), async (_tx, ctx) => {
        const [row] = await ctx.query('SELECT pg_backend_pid() AS pid');
        pidOf(Number(row?.pid));
        // A handler that works until its signal says stop; the watchdog only ends a failing run.
        await new Promise<void>((resolve) => {
          let gaveUp = false;
          const watchdog = setTimeout(() => {
            gaveUp = true;
            resolve();
          }, 10_000);
          ctx.signal.addEventListener('abort', () => {
            fired = !gaveUp;
            clearTimeout(watchdog);
            resolve();
          });
        });
      })
      .then(
        () => 'settled',
        (error: unknown) => (isLockkitError(error) ? error.code : String(error)),
      );
    await admin.query('SELECT pg_terminate_backend($1)', [await pid]);
    expect(await call).toBe('CONNECTION_LOST');
    expect(fired, 'the signal fired only after the task had given up').toBe(true);
    // The pool lends a live connection again.
    expect(await locks.withLock(key(), () => 'again')).toEqual({ executed: true, result: 'again' });
  }, 30_000);
});
