/**
 * `@Exclusive` when the lock's connection dies under a running method (review F1): Postgres
 * releases the lock at once, so another replica may enter; the method learns of it through
 * `exclusiveSignal()`. Real Postgres through @lockkit/pg; the lock's backend is terminated with
 * `pg_terminate_backend` (found through `pg_locks`) while the method waits on its signal — no
 * timing window.
 */
import 'reflect-metadata';
import { randomBytes } from 'node:crypto';
import { isLockkitError, LockKey } from '@lockkit/core';
import { createLockKit } from '@lockkit/pg';
import { testDatabaseUrl } from '@lockkit/test-db';
import { Injectable, Module } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import pg from 'pg';
import { afterAll, beforeAll, expect, it } from 'vitest';
import {
  Exclusive,
  exclusiveSignal,
  LockkitModuleError,
  LockkitScheduleModule,
} from '../src/index.js';

const schema = `lockkit_nest_sig_${randomBytes(4).toString('hex')}`;
let admin: pg.Pool;

beforeAll(() => {
  admin = new pg.Pool({ connectionString: testDatabaseUrl(), max: 2 });
});
afterAll(async () => {
  await admin.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
  await admin.end();
});

/** The backends holding the advisory lock of job `name`, found from outside through pg_locks. */
async function lockHolders(name: string): Promise<number[]> {
  const { classid, objid, objsubid } = LockKey.fromNames(schema, name).pgLocks;
  const { rows } = await admin.query<{ pid: number }>(
    `SELECT pid FROM pg_locks
      WHERE locktype = 'advisory' AND granted AND classid = $1::int8::oid
        AND objid = $2::int8::oid AND objsubid = $3`,
    [classid, objid, objsubid],
  );
  return rows.map((r) => r.pid);
}

/** Resolves with the signal's reason once it aborts. */
const aborted = (signal: AbortSignal) =>
  new Promise<unknown>((resolve) => {
    if (signal.aborted) resolve(signal.reason);
    else signal.addEventListener('abort', () => resolve(signal.reason), { once: true });
  });

it('aborts exclusiveSignal() when the lock backend is terminated under the running method', async () => {
  const pool = new pg.Pool({ connectionString: testDatabaseUrl(), max: 2 });
  pool.on('error', () => {}); // the terminated connection's error, once it is back in the pool
  const name = `sig-${randomBytes(3).toString('hex')}`;
  let entered!: () => void;
  const inside = new Promise<void>((resolve) => {
    entered = resolve;
  });
  const observed: unknown[] = [];
  @Injectable()
  class Sweep {
    @Exclusive({ name, namespace: schema })
    async run(): Promise<void> {
      const signal = exclusiveSignal();
      entered();
      observed.push(await aborted(signal));
      signal.throwIfAborted(); // the lock is gone: stop before another replica overlaps this one
    }
  }
  @Module({
    imports: [
      LockkitScheduleModule.forRoot({
        lockKit: createLockKit(pool, { schema }),
        migrate: true,
        logger: false,
      }),
    ],
    providers: [Sweep],
  })
  class AppModule {}
  const context = await NestFactory.createApplicationContext(AppModule, { logger: false });
  await context.init();
  try {
    const call = context
      .get(Sweep)
      .run()
      .then(
        () => 'resolved',
        (e: unknown) => e,
      );
    await inside;
    const holders = await lockHolders(name);
    expect(holders).toHaveLength(1);
    await admin.query('SELECT pg_terminate_backend($1)', [holders[0]]);
    const outcome = await call;
    expect(observed).toHaveLength(1);
    // The reason is what the connection died of (here the driver's 57P01 error); the call
    // rejects with lockkit's typed error for a lost lock.
    expect(observed[0]).toBeInstanceOf(Error);
    expect(isLockkitError(outcome) && outcome.code).toBe('CONNECTION_LOST');
    // Postgres released the lock with the connection: another replica could enter now.
    const other = createLockKit(admin, { schema });
    expect((await other.runExclusiveJob(schema, name, () => 'entered')).executed).toBe(true);
  } finally {
    await context.close();
    await pool.end();
  }
});

it('aborts exclusiveSignal() when the server ends the idle lock transaction (idle_in_transaction_session_timeout)', async () => {
  // The lock's transaction sits idle while the method works: a server timeout shorter than the
  // method ends the session, and the lock with it. The method waits on its signal, not on a clock.
  // The timeout is set on the lock's own transaction once the method runs (SET LOCAL, sent on
  // that connection from outside the call), never before: a starved process may sit longer
  // than any timeout between the lock's statements — here each statement before the method
  // answers 300 ms late, longer than the 200 ms timeout, and the test still holds.
  const pool = new pg.Pool({ connectionString: testDatabaseUrl(), max: 2 });
  pool.on('error', () => {});
  const clients: pg.PoolClient[] = [];
  let methodRunning = false;
  pool.on('connect', (client) => {
    clients.push(client);
    const query = client.query.bind(client) as (...args: unknown[]) => Promise<unknown>;
    Object.assign(client, {
      query: async (...args: unknown[]) => {
        const result = await query(...args);
        if (!methodRunning) await new Promise((r) => setTimeout(r, 300));
        return result;
      },
    });
  });
  const name = `idle-${randomBytes(3).toString('hex')}`;
  const observed: unknown[] = [];
  @Injectable()
  class Sweep {
    @Exclusive({ name, namespace: schema })
    async run(): Promise<void> {
      methodRunning = true;
      const signal = exclusiveSignal();
      const [pid] = await lockHolders(name);
      const holder = clients.find(
        (c) => (c as unknown as { processID?: number }).processID === pid,
      );
      if (holder === undefined) throw new Error('the lock holder is not a connection of this pool');
      await holder.query('SET LOCAL idle_in_transaction_session_timeout = 200');
      observed.push(await aborted(signal));
      signal.throwIfAborted();
    }
  }
  @Module({
    imports: [
      LockkitScheduleModule.forRoot({ lockKit: createLockKit(pool, { schema }), logger: false }),
    ],
    providers: [Sweep],
  })
  class AppModule {}
  const context = await NestFactory.createApplicationContext(AppModule, { logger: false });
  await context.init();
  try {
    const outcome = await context
      .get(Sweep)
      .run()
      .then(
        () => 'resolved',
        (e: unknown) => e,
      );
    expect(observed).toHaveLength(1);
    expect(isLockkitError(outcome) && outcome.code).toBe('IDLE_IN_TRANSACTION_TIMEOUT');
  } finally {
    await context.close();
    await pool.end();
  }
});

it('refuses exclusiveSignal() outside an @Exclusive call', () => {
  let error: unknown;
  try {
    exclusiveSignal();
  } catch (e) {
    error = e;
  }
  expect(error).toBeInstanceOf(LockkitModuleError);
  expect((error as LockkitModuleError).reason).toBe('OUTSIDE_EXCLUSIVE');
});
