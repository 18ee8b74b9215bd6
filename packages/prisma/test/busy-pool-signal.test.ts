/**
 * A task's `signal` fires when its connection dies even while every other connection of the pool
 * is busy. Prisma reports no connection events, so lockkit asks the server which watched backends
 * are gone, through a connection of the pool: with none free that question waited, and meanwhile
 * the lock was gone on the server (a rival could take it and run) while the task, not told, ran
 * on. Found by an outside attack (a pool of two, the app's own work on the second connection).
 */
import { randomBytes } from 'node:crypto';
import { isLockkitError, LockKey } from '@lockkit/core';
import { testDatabaseUrl } from '@lockkit/test-db';
import pg from 'pg';
import { afterEach, describe, expect, it } from 'vitest';
import { prismaInstance } from './instances.js';

const closers: (() => Promise<unknown>)[] = [];
/** Run first: a failing run leaves the app's transaction open, and the pool's close waits for it. */
const releases: (() => void)[] = [];
afterEach(async () => {
  for (const release of releases.splice(0)) release();
  await Promise.all(closers.splice(0).map((close) => close()));
});

const key = () => LockKey.fromNames('prisma-busy-pool', randomBytes(6).toString('hex'));

/** Only ends a failing run: a passing one is told long before. */
const WATCHDOG_MS = 10_000;

function setup(poolSize: number) {
  const instance = prismaInstance(testDatabaseUrl(), poolSize, {
    timeout: 30_000,
    maxWait: 10_000,
    livenessCheckMs: 200,
  });
  closers.push(instance.close);
  return { instance, locks: instance.locks() };
}

type Locks = ReturnType<typeof setup>['locks'];

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
function longTask(locks: Locks, givesUp = true) {
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
    .withLock(key(), async (_tx, ctx) => {
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
    })
    .then(
      (r) => r,
      (error: unknown) => (isLockkitError(error) ? error.code : String(error)),
    );
  return { pid, told, call, finish, aborted: () => signal?.aborted };
}

/** The application's own interactive transaction on the same client, holding one connection. */
async function appHoldsConnection(prisma: ReturnType<typeof setup>['instance']['prisma']) {
  let release!: () => void;
  const released = new Promise<void>((resolve) => {
    release = resolve;
  });
  releases.push(release);
  let holding!: () => void;
  const held = new Promise<void>((resolve) => {
    holding = resolve;
  });
  const done = prisma.$transaction(
    async (tx) => {
      await tx.$queryRawUnsafe('SELECT 1');
      holding();
      await released;
    },
    { timeout: 30_000, maxWait: 10_000 },
  );
  await held;
  return { release, done };
}

describe("a task's signal on connection loss while the pool's other connections are busy", () => {
  it("fires while the app's own transaction holds the other connection of a pool of two", async () => {
    const { instance, locks } = setup(2);
    const admin = await adminClient();
    const task = longTask(locks);
    const pid = await task.pid;
    const app = await appHoldsConnection(instance.prisma);
    await admin.query('SELECT pg_terminate_backend($1)', [pid]);
    // Told while the app still holds the pool's only other connection: the check could not ask
    // through the pool.
    expect(await task.told, 'the signal did not fire while the pool was busy').toBe(true);
    app.release();
    await app.done;
    expect(await task.call).toBe('CONNECTION_LOST');
    // The pool lends live connections again.
    expect(await locks.withLock(key(), () => 'again')).toEqual({ executed: true, result: 'again' });
  }, 30_000);

  it('fires for the one task whose backend died when lock tasks take the whole pool, and for no other', async () => {
    const { locks } = setup(3);
    const admin = await adminClient();
    // Only the task whose backend dies gives up on its own: the others hold their connections
    // until the end, so no connection of the pool frees meanwhile.
    const tasks = [longTask(locks, false), longTask(locks), longTask(locks, false)];
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
});
