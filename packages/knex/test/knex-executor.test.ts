/**
 * Knex specifics, against a real PostgreSQL: the task's `trx` is Knex's own transaction (its
 * query-builder writes commit and roll back with the lock, `trx.transaction()` is a savepoint),
 * a task that ends Knex's transaction itself is never reported executed, and a Knex over another
 * dialect is refused.
 */
import { randomBytes } from 'node:crypto';
import { isLockkitError, LockKey } from '@lockkit/core';
import { testDatabaseUrl } from '@lockkit/test-db';
import knex from 'knex';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLockKit, knexExecutor } from '../src/index.js';
import { knexInstance } from './instances.js';
import { startLateReadyProxy } from './late-ready-proxy.js';

const schema = `lockkit_knex_${randomBytes(6).toString('hex')}`;
const instance = knexInstance(testDatabaseUrl(), 3);
const { db } = instance;
const locks = createLockKit(db);
const table = `${schema}.items`;
const key = () => LockKey.fromNames('lockkit-knex-test', randomBytes(8).toString('hex'));

/** Advisory locks on `k` held by anyone, read from pg_locks on a connection of its own. */
async function holders(k: LockKey): Promise<number> {
  const [objid1, objid2] = k.pair as readonly [number, number];
  const { rows } = await db.raw(
    `SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory'
       AND classid = (?::int4)::bit(32)::int8::oid AND objid = (?::int4)::bit(32)::int8::oid`,
    [objid1, objid2],
  );
  return rows[0].n as number;
}

beforeAll(async () => {
  await db.raw(`CREATE SCHEMA ${schema}`);
  await db.schema.withSchema(schema).createTable('items', (t) => {
    t.text('name').primary();
  });
});

afterAll(async () => {
  await db.raw(`DROP SCHEMA ${schema} CASCADE`);
  await instance.close();
});

describe('Knex executor', () => {
  it("writes through the task's trx commit with the lock, and roll back when the task throws", async () => {
    const committed = await locks.withLock(key(), async (trx) => {
      await trx(table).insert({ name: 'kept' });
      return trx.isTransaction;
    });
    expect(committed).toEqual({ executed: true, result: true });
    const failed = locks.withLock(key(), async (trx) => {
      await trx(table).insert({ name: 'undone' });
      throw new Error('task failed');
    });
    await expect(failed).rejects.toThrow('task failed');
    const names = await db(table).pluck('name');
    expect(names).toContain('kept');
    expect(names).not.toContain('undone');
    expect(instance.checkedOut()).toBe(0);
  });

  it('a task rejecting with no error still rejects (Knex resolves a rollback without one)', async () => {
    const outcome = await locks
      .withLock(key(), async (trx) => {
        await trx(table).insert({ name: 'no-reason' });
        return Promise.reject(undefined);
      })
      .then(
        (result) => ({ result }),
        (error: unknown) => ({ error }),
      );
    expect(outcome).not.toHaveProperty('result');
    expect(await db(table).where({ name: 'no-reason' }).first()).toBeUndefined();
  });

  it('trx.transaction() inside a task is a savepoint: rolling it back keeps the lock', async () => {
    const k = key();
    const r = await locks.withLock(k, async (trx) => {
      await trx
        .transaction(async (inner) => {
          await inner(table).insert({ name: 'savepoint' });
          throw new Error('roll the savepoint back');
        })
        .catch((error: Error) => expect(error.message).toBe('roll the savepoint back'));
      await trx(table).insert({ name: 'after-savepoint' });
      return holders(k);
    });
    expect(r).toEqual({ executed: true, result: 1 });
    const names = await db(table).pluck('name');
    expect(names).toContain('after-savepoint');
    expect(names).not.toContain('savepoint');
    expect(await holders(k)).toBe(0);
  });

  it("a task that commits Knex's transaction itself (trx.commit()) is LOCK_NOT_HELD, never executed", async () => {
    const k = key();
    let finished = false;
    const outcome = await locks
      .withLock(k, async (trx) => {
        await trx(table).insert({ name: 'early-commit' });
        await trx.commit();
        // Knex settles its transaction here; the task goes on, and must still be waited for.
        await new Promise((resolve) => setTimeout(resolve, 50));
        finished = true;
        return 'done';
      })
      .then(
        (result) => ({ result }),
        (error: unknown) => ({ error }),
      );
    expect(finished).toBe(true);
    const error = (outcome as { error?: unknown }).error;
    expect(isLockkitError(error) && error.code).toBe('LOCK_NOT_HELD');
    expect(await holders(k)).toBe(0);
    expect(instance.checkedOut()).toBe(0);
  });

  it("a failed BEGIN never runs the task (Knex runs its callback even then): the driver's error comes back as it was", async () => {
    const executor = knexExecutor(db);
    let ran = false;
    const task = async () => {
      ran = true;
      return 'ran';
    };
    const failing = 'SELECT 1 / 0';
    for (const attempt of [
      () => executor.firstThenBegin?.(failing, task),
      () => executor.pipelinedTransaction?.(failing, task),
    ]) {
      const error = await Promise.resolve(attempt()).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect((error as { code?: unknown } | undefined)?.code).toBe('22012');
    }
    expect(ran).toBe(false);
    // The connection went back clean: the next transaction on the pool runs normally.
    expect(await locks.withLock(key(), async () => 'after')).toEqual({
      executed: true,
      result: 'after',
    });
    expect(instance.checkedOut()).toBe(0);
  });

  it("refuses a Knex transaction as its handle, before any SQL: the caller's transaction is untouched", async () => {
    const name = randomBytes(6).toString('hex');
    await expect(
      db.transaction(async (trx) => {
        await trx(table).insert({ name: `${name}-before` });
        // A trx's client hands out the trx's own connection: lockkit's transaction, and its
        // clean-up ROLLBACK, would land in the caller's transaction.
        let refusal: unknown;
        try {
          const misused = createLockKit(trx);
          await misused.withLock(key(), async () => 'ran').catch(() => {});
        } catch (error) {
          refusal = error;
        }
        await trx(table).insert({ name: `${name}-after` });
        throw Object.assign(new Error('the caller rolls back'), { refusal });
      }),
    ).rejects.toMatchObject({
      message: 'the caller rolls back',
      refusal: { code: 'OPTION_INVALID' },
    });
    // Nothing of the rolled-back transaction is kept.
    const { rows } = await db.raw(`SELECT name FROM ${table} WHERE name LIKE ?`, [`${name}-%`]);
    expect(rows).toEqual([]);
  });

  it('refuses a Knex instance of another dialect before any SQL', () => {
    const cockroach = knex({
      client: 'cockroachdb',
      connection: testDatabaseUrl(),
      pool: { min: 0 },
    });
    try {
      expect(() => knexExecutor(cockroach)).toThrow(/'pg' client/);
    } finally {
      void cockroach.destroy();
    }
  });
});

describe('Knex over a pg.Pool of the application (connectionPool)', () => {
  it('takes its connections from that pool, gives them back, and sees a pool of one', async () => {
    const pool = new pg.Pool({ connectionString: testDatabaseUrl(), max: 1 });
    pool.on('error', () => {});
    const shared = knex({ client: 'pg', connectionPool: pool });
    try {
      const sharedLocks = createLockKit(shared);
      const r = await sharedLocks.withLock(key(), async (trx) => {
        const { rows } = await trx.raw('SELECT 1 AS one');
        // One connection only: a lockkit call from inside the task could never get it.
        const nested = await sharedLocks
          .withLock(key(), async () => 'inner')
          .then(
            () => 'ran',
            (error: unknown) => (isLockkitError(error) ? error.code : String(error)),
          );
        return { one: rows[0].one as number, nested };
      });
      expect(r).toEqual({ executed: true, result: { one: 1, nested: 'NESTED_CALL' } });
      const s = await sharedLocks.withSessionLock(key(), async (conn) => {
        const { rows } = await shared.raw('SELECT 2 AS two').connection(conn);
        return rows[0].two as number;
      });
      expect(s).toEqual({ executed: true, result: 2 });
      expect(pool.totalCount - pool.idleCount).toBe(0);
    } finally {
      await shared.destroy();
      await pool.end();
    }
  });
});

describe('a failed opening when the server says ReadyForQuery late', () => {
  it('BEGIN; <opening> that failed is rolled back before the connection goes back to the pool', async () => {
    const proxy = await startLateReadyProxy(testDatabaseUrl(), 1000);
    const late = knexInstance(proxy.url, 1);
    try {
      const failed = await late.executor
        .pipelinedTransaction?.('SELECT 1 / 0', async () => 'ran')
        .then(
          () => undefined,
          (error: unknown) => (error as { code?: unknown }).code,
        );
      expect(failed).toBe('22012');
      // The pool's only connection serves the next call: it came back outside any transaction.
      expect(await createLockKit(late.db).withLock(key(), async () => 'next')).toEqual({
        executed: true,
        result: 'next',
      });
    } finally {
      await late.close();
      await proxy.close();
    }
  });
});
