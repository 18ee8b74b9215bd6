/**
 * A task's `signal` fires when its connection dies even while every other connection of the pool
 * is busy. Prisma reports no connection events, so lockkit asks the server which watched backends
 * are gone, through a connection of the pool: with none free that question waited, and meanwhile
 * the lock was gone on the server (a rival could take it and run) while the task, not told, ran
 * on. Found by an outside attack (a pool of two, the app's own work on the second connection).
 */
import { randomBytes } from 'node:crypto';
import { LockKey } from '@lockkit/core';
import { testDatabaseUrl } from '@lockkit/test-db';
import { appHoldsConnection, watchedTask } from '@lockkit/test-db/watched-task';
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

/** A lock task on a fresh key that works until told (see @lockkit/test-db's watched-task). */
const longTask = (locks: Locks, givesUp = true) =>
  watchedTask((task) => locks.withLock(key(), (tx, ctx) => task(tx, ctx)), releases, givesUp);

/** The application's own interactive transaction on the same client, holding one connection. */
const appHolds = (prisma: ReturnType<typeof setup>['instance']['prisma']) =>
  appHoldsConnection(
    (holding, released) =>
      prisma.$transaction(
        async (tx) => {
          await tx.$queryRawUnsafe('SELECT 1');
          holding();
          await released;
        },
        { timeout: 30_000, maxWait: 10_000 },
      ),
    releases,
  );

describe("a task's signal on connection loss while the pool's other connections are busy", () => {
  it("fires while the app's own transaction holds the other connection of a pool of two", async () => {
    const { instance, locks } = setup(2);
    const admin = await adminClient();
    const task = longTask(locks);
    const pid = await task.pid;
    const app = await appHolds(instance.prisma);
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
