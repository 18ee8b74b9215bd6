/**
 * A task's `signal` fires when its connection dies even while every other connection of the pool
 * is busy. The dead-backend check asks the server through a connection of the pool: with none free
 * it waited, and meanwhile the lock was gone on the server (a rival could take it and run) while
 * the task, not told, ran on. Found by an outside attack (a pool of two, the app's own work on the
 * second connection; with and without the `pool` option).
 */
import { randomBytes } from 'node:crypto';
import { isLockkitError, type LockClient, LockKey } from '@lockkit/core';
import { testDatabaseUrl } from '@lockkit/test-db';
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

/** Only ends a failing run: a passing one is told long before. */
const WATCHDOG_MS = 10_000;

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

/**
 * Starts a lock task that reports its backend pid, then works until its signal fires or `finish`
 * is called. With `givesUp`, it gives up after WATCHDOG_MS: `told` says whether the signal fired
 * before that.
 */
function longTask(
  locks: Locks,
  options: { idleInTransactionTimeoutMs?: number } = {},
  givesUp = true,
) {
  let pidOf!: (pid: number) => void;
  const pid = new Promise<number>((resolve) => {
    pidOf = resolve;
  });
  let toldOf!: (told: boolean) => void;
  const told = new Promise<boolean>((resolve) => {
    toldOf = resolve;
  });
  let signal: AbortSignal | undefined;
  let finish!: () => void;
  const finished = new Promise<void>((resolve) => {
    finish = resolve;
  });
  // A failing run leaves it working: the pool's close would wait for it.
  releases.push(finish);
  const call = locks
    .withLock(
      key(),
      async (_trx, ctx) => {
        const [row] = await ctx.query('SELECT pg_backend_pid() AS pid');
        signal = ctx.signal;
        pidOf(Number(row?.pid));
        // Works outside the database (an HTTP call, a queue) until told to stop.
        await new Promise<void>((resolve) => {
          const watchdog = setTimeout(
            () => {
              toldOf(false);
              resolve();
            },
            givesUp ? WATCHDOG_MS : 2 ** 31 - 1,
          );
          ctx.signal.addEventListener('abort', () => {
            clearTimeout(watchdog);
            toldOf(true);
            resolve();
          });
          void finished.then(() => {
            clearTimeout(watchdog);
            resolve();
          });
        });
        return 'done';
      },
      options,
    )
    .then(
      (r) => r,
      (error: unknown) => (isLockkitError(error) ? error.code : String(error)),
    );
  return { pid, told, call, finish, aborted: () => signal?.aborted };
}

/** The application's own transaction on the same Kysely, holding one connection until released. */
async function appHoldsConnection(db: ReturnType<typeof setup>['instance']['db']) {
  let release!: () => void;
  const released = new Promise<void>((resolve) => {
    release = resolve;
  });
  releases.push(release);
  let holding!: () => void;
  const held = new Promise<void>((resolve) => {
    holding = resolve;
  });
  const done = db.transaction().execute(async (trx) => {
    await trx.selectNoFrom((eb) => eb.lit(1).as('one')).execute();
    holding();
    await released;
  });
  await held;
  return { release, done };
}

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
      const app = await appHoldsConnection(instance.db);
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
    const app = await appHoldsConnection(instance.db);
    // Waits outside the database: after 300 ms idle in its transaction the server ends its backend.
    const task = longTask(locks, { idleInTransactionTimeoutMs: 300 });
    expect(await task.told, 'the signal did not fire while the pool was busy').toBe(true);
    app.release();
    await app.done;
    expect(await task.call).toBe('IDLE_IN_TRANSACTION_TIMEOUT');
  }, 30_000);
});
