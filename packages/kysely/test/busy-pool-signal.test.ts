/**
 * A task's `signal` fires when its connection dies even while every other connection of the pool
 * is busy. The dead-backend check asks the server through a connection of the pool: with none free
 * it waited, and meanwhile the lock was gone on the server (a rival could take it and run) while
 * the task, not told, ran on. Found by an outside attack (a pool of two, the app's own work on the
 * second connection; with and without the `pool` option).
 */
import { randomBytes } from 'node:crypto';
import { type LockClient, LockKey } from '@lockkit/core';
import { testDatabaseUrl } from '@lockkit/test-db';
import { appHoldsConnection, watchedTask } from '@lockkit/test-db/watched-task';
import type { Transaction } from 'kysely';
import pg from 'pg';
import { afterEach, describe, expect, it } from 'vitest';
import { createLockKit } from '../src/index.js';
import { kyselyInstance, type TestDatabase } from './instances.js';

const closers: (() => Promise<unknown>)[] = [];
/** Run first: a failing run leaves the app's transaction open, and the pool's close waits for it. */
const releases: (() => void)[] = [];
afterEach(async () => {
  for (const release of releases.splice(0)) release();
  await Promise.all(closers.splice(0).map((close) => close()));
});

const key = () => LockKey.fromNames('kysely-busy-pool', randomBytes(6).toString('hex'));

type Locks = LockClient<Transaction<TestDatabase>, unknown>;

function setup(poolSize: number, givePool: boolean) {
  const instance = kyselyInstance(testDatabaseUrl(), poolSize, false, givePool);
  closers.push(instance.close);
  const locks: Locks = createLockKit(
    instance.db,
    givePool ? { pool: instance.pool } : { livenessCheckMs: 200 },
  );
  return { instance, locks };
}

async function adminClient(): Promise<pg.Client> {
  const admin = new pg.Client({ connectionString: testDatabaseUrl() });
  await admin.connect();
  closers.push(() => admin.end());
  return admin;
}

/** A lock task on a fresh key that works until told (see @lockkit/test-db's watched-task). */
const longTask = (
  locks: Locks,
  options: { idleInTransactionTimeoutMs?: number } = {},
  givesUp = true,
) =>
  watchedTask(
    (task) => locks.withLock(key(), (tx, ctx) => task(tx, ctx), options),
    releases,
    givesUp,
  );

/** The application's own transaction on the same Kysely, holding one connection until released. */
const appHolds = (db: ReturnType<typeof setup>['instance']['db']) =>
  appHoldsConnection(
    (holding, released) =>
      db.transaction().execute(async (trx) => {
        await trx.selectNoFrom((eb) => eb.lit(1).as('one')).execute();
        holding();
        await released;
      }),
    releases,
  );

describe.each([
  ['the pool option given', true],
  ['no pool option', false],
])(
  "a task's signal on connection loss while the pool's other connections are busy (%s)",
  (_name, givePool) => {
    it("fires while the app's own transaction holds the other connection of a pool of two", async () => {
      const { instance, locks } = setup(2, givePool);
      const admin = await adminClient();
      const task = longTask(locks);
      const pid = await task.pid;
      const app = await appHolds(instance.db);
      await admin.query('SELECT pg_terminate_backend($1)', [pid]);
      // Told while the app still holds the pool's only other connection: the check could not ask
      // through the pool.
      expect(await task.told, 'the signal did not fire while the pool was busy').toBe(true);
      app.release();
      await app.done;
      expect(await task.call).toBe('CONNECTION_LOST');
      // The pool lends live connections again.
      expect(await locks.withLock(key(), () => 'again')).toEqual({
        executed: true,
        result: 'again',
      });
    }, 30_000);

    it('fires for the one task whose backend died when lock tasks take the whole pool, and for no other', async () => {
      const { locks } = setup(3, givePool);
      const admin = await adminClient();
      // Only the task whose backend dies gives up on its own: the others hold their connections
      // until the end, so no connection of the pool frees meanwhile.
      const tasks = [longTask(locks, {}, false), longTask(locks), longTask(locks, {}, false)];
      const pids = await Promise.all(tasks.map((t) => t.pid));
      await admin.query('SELECT pg_terminate_backend($1)', [pids[1]]);
      expect(await tasks[1]?.told, 'the signal did not fire while the pool was busy').toBe(true);
      expect(await tasks[1]?.call).toBe('CONNECTION_LOST');
      expect(tasks.map((t) => t.aborted())).toEqual([false, true, false]);
      for (const task of tasks) task.finish();
      expect(await Promise.all([tasks[0]?.call, tasks[2]?.call])).toEqual([
        { executed: true, result: 'done' },
        { executed: true, result: 'done' },
      ]);
    }, 30_000);
  },
);

describe("a task's signal when the server's idle_in_transaction timeout ends its backend", () => {
  it("fires while the app's own transaction holds the other connection of a pool of two (pool option given)", async () => {
    const { instance, locks } = setup(2, true);
    const app = await appHolds(instance.db);
    // Waits outside the database: after 300 ms idle in its transaction the server ends its backend.
    const task = longTask(locks, { idleInTransactionTimeoutMs: 300 });
    expect(await task.told, 'the signal did not fire while the pool was busy').toBe(true);
    app.release();
    await app.done;
    expect(await task.call).toBe('IDLE_IN_TRANSACTION_TIMEOUT');
  }, 30_000);
});
