/**
 * TypeORM specifics, on a real Postgres: the task's EntityManager is inside lockkit's transaction
 * as TypeORM sees it (a nested `manager.transaction()` is a savepoint, the DataSource's isolation
 * level applies, transaction subscribers fire), the session handle is a QueryRunner on the lock's
 * own connection, and a DataSource the executor cannot use is refused before any SQL.
 */
import { randomBytes } from 'node:crypto';
import { isLockkitError, LockKey } from '@lockkit/core';
import { testDatabaseUrl } from '@lockkit/test-db';
import { startHeldGoodbyeProxy } from '@lockkit/test-db/held-goodbye-proxy';
import {
  DataSource,
  type EntityManager,
  type EntitySubscriberInterface,
  type TransactionCommitEvent,
} from 'typeorm';
import { afterEach, describe, expect, it } from 'vitest';
import { createLockKit, typeormExecutor } from '../src/index.js';

const closers: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  await Promise.all(closers.splice(0).map((close) => close()));
});

const key = (what: string) =>
  LockKey.fromNames('typeorm-test', `${what}-${randomBytes(6).toString('hex')}`);

async function dataSource(
  extra: Partial<{ isolationLevel: 'SERIALIZABLE'; poolSize: number }> = {},
) {
  const ds = new DataSource({ type: 'postgres', url: testDatabaseUrl(), poolSize: 3, ...extra });
  await ds.initialize();
  closers.push(() => ds.destroy());
  return ds;
}

/** Advisory locks this connection holds on `k`. */
const heldHere = (k: LockKey) =>
  `SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()
     AND objid = ${k.pgLocks.objid}::int8::oid`;

describe('the TypeORM executor', () => {
  it("hands the task the transaction's EntityManager: a nested manager.transaction() is a savepoint, and the lock stays held", async () => {
    const ds = await dataSource();
    const locks = createLockKit(ds);
    const outer = key('outer');
    const inner = key('inner');
    const [i1, i2] = inner.pair as readonly [number, number];
    const r = await locks.withLock(outer, async (manager) => {
      expect(manager.queryRunner?.isTransactionActive).toBe(true);
      // A nested transaction that rolls back: only its own work (the inner lock) goes.
      await manager
        .transaction(async (nested) => {
          await nested.query(`SELECT pg_advisory_xact_lock(${i1}, ${i2})`);
          throw new Error('roll the savepoint back');
        })
        .catch(() => {});
      const [{ n: innerHeld }] = await manager.query(heldHere(inner));
      // One that commits: a savepoint released, not lockkit's transaction committed.
      await manager.transaction((nested) => nested.query('SELECT 1'));
      const [{ n: outerHeld }] = await manager.query(heldHere(outer));
      return { innerHeld, outerHeld, active: manager.queryRunner?.isTransactionActive };
    });
    expect(r).toEqual({ executed: true, result: { innerHeld: 0, outerHeld: 1, active: true } });
  });

  it("runs the lock's transaction at the DataSource's isolation level", async () => {
    const ds = await dataSource({ isolationLevel: 'SERIALIZABLE' });
    const r = await createLockKit(ds).withLock(key('isolation'), async (manager) => {
      const [row] = await manager.query('SHOW transaction_isolation');
      return row.transaction_isolation;
    });
    expect(r).toEqual({ executed: true, result: 'serializable' });
  });

  it("fires TypeORM's transaction subscribers around lockkit's transaction", async () => {
    const ds = await dataSource();
    const seen: string[] = [];
    const subscriber: EntitySubscriberInterface = {
      afterTransactionStart: () => {
        seen.push('start');
      },
      afterTransactionCommit: (_event: TransactionCommitEvent) => {
        seen.push('commit');
      },
      afterTransactionRollback: () => {
        seen.push('rollback');
      },
    };
    ds.subscribers.push(subscriber);
    // No engine self-test: its own short transactions would fire the subscribers too.
    const locks = createLockKit(ds, { engineSelfTest: false });
    await locks.withLock(key('subscribers'), async () => 'ok');
    await locks
      .withLock(key('subscribers'), async () => {
        throw new Error('task failed');
      })
      .catch(() => {});
    expect(seen).toEqual(['start', 'commit', 'start', 'rollback']);
  });

  it("gives session tasks a QueryRunner on the lock's own connection, back in the pool afterwards", async () => {
    const ds = await dataSource();
    const k = key('session');
    const pool = (ds.driver as unknown as { master: { totalCount: number; idleCount: number } })
      .master;
    const r = await createLockKit(ds).withSessionLock(k, async (runner, ctx) => {
      const [mine] = await runner.query(heldHere(k));
      const [{ pid: runnerPid }] = await runner.query('SELECT pg_backend_pid() AS pid');
      const [lockkitRow] = await ctx.query('SELECT pg_backend_pid() AS pid');
      return {
        held: mine.n,
        same: runnerPid === lockkitRow?.pid,
        inTransaction: runner.isTransactionActive,
      };
    });
    expect(r).toEqual({ executed: true, result: { held: 1, same: true, inTransaction: false } });
    expect(pool.totalCount - pool.idleCount).toBe(0);
  });

  it('refuses a DataSource of another driver, and one not initialized, with OPTION_INVALID', async () => {
    const mysql = new DataSource({ type: 'mysql', url: 'mysql://nobody@127.0.0.1:1/none' });
    expect(() => typeormExecutor(mysql)).toThrow(/type 'postgres'/);
    const later = new DataSource({ type: 'postgres', url: testDatabaseUrl() });
    const locks = createLockKit(later);
    const error = await locks.withLock(key('uninitialized'), async () => 'ran').catch((e) => e);
    expect(isLockkitError(error) && error.code).toBe('OPTION_INVALID');
    expect(String(error.message)).toMatch(/initialize/);
  });

  it('refuses an EntityManager or a QueryRunner in place of the DataSource at creation, saying what to pass', async () => {
    const ds = await dataSource();
    const runner = ds.createQueryRunner();
    closers.push(() => runner.release());
    for (const [given, named] of [
      [ds.manager, /EntityManager/],
      [runner, /QueryRunner/],
    ] as const) {
      let refusal: unknown;
      try {
        typeormExecutor(given as unknown as DataSource);
      } catch (error) {
        refusal = error;
      }
      expect(isLockkitError(refusal) && refusal.code).toBe('OPTION_INVALID');
      expect((refusal as Error).message).toMatch(named);
      expect((refusal as Error).message).toMatch(/DataSource/);
    }
    // Inside a transaction: the manager the callback gets is refused the same way.
    const inside = await ds.transaction(async (manager) => {
      try {
        createLockKit(manager as unknown as DataSource);
        return 'accepted';
      } catch (error) {
        return isLockkitError(error) ? error.code : String(error);
      }
    });
    expect(inside).toBe('OPTION_INVALID');
  });

  it('knows a pool of one (poolSize or extra.max) as a single connection', () => {
    const one = new DataSource({ type: 'postgres', url: testDatabaseUrl(), poolSize: 1 });
    const extra = new DataSource({ type: 'postgres', url: testDatabaseUrl(), extra: { max: 1 } });
    const many = new DataSource({
      type: 'postgres',
      url: testDatabaseUrl(),
      poolSize: 1,
      extra: { max: 4 },
    });
    expect(typeormExecutor(one).singleConnection).toBe(true);
    expect(typeormExecutor(extra).singleConnection).toBe(true);
    expect(typeormExecutor(many).singleConnection).toBe(false);
  });
  it('runs the next call on a fresh connection when the pooled one lost its backend a moment ago, before the pool saw it close', async () => {
    // The pool of one holds a connection whose backend is terminated while the proxy holds back
    // the server's FATAL and hang-up: the pool lends it as live, START TRANSACTION goes nowhere,
    // and only then does the client hear. Nothing of the call had reached the server: it begins
    // again.
    const proxy = await startHeldGoodbyeProxy(testDatabaseUrl());
    closers.push(proxy.close);
    const ds = new DataSource({ type: 'postgres', url: proxy.url, poolSize: 1 });
    await ds.initialize();
    closers.push(() => ds.destroy());
    const admin = await dataSource();
    const locks = createLockKit(ds);
    const backend = async (manager: EntityManager) =>
      ((await manager.query('SELECT pg_backend_pid() AS pid')) as { pid: number }[])[0]?.pid;
    const first = await locks.runExclusiveJob('typeorm-test', 'dead-start', backend);
    expect(first.executed).toBe(true);
    const { clientSpoke } = proxy.hold();
    await proxy.terminateBackends((text, params) => admin.query(text, params));
    const next = locks.runExclusiveJob('typeorm-test', 'dead-start', backend);
    await clientSpoke;
    proxy.release();
    const outcome = await next.catch((error: unknown) => error);
    expect(outcome).toMatchObject({ executed: true });
    expect((outcome as { result: number }).result).not.toBe(first.executed && first.result);
  });
});
