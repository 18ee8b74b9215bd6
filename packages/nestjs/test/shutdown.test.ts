/**
 * Shutdown with `@Exclusive` calls running (review F6): `app.close()` aborts their
 * `exclusiveSignal()` and waits for them (up to `stopTimeoutMs`) before `onApplicationShutdown`,
 * where the README says to end the pool; and neither a call nor a tick that ignores its signal,
 * nor a database that stopped answering, holds shutdown past `stopTimeoutMs` (review F3). Each
 * "stuck" thing is released only from `onApplicationShutdown`, which Nest calls after lockkit's
 * drain: an unbounded drain would deadlock the test instead of passing it slowly. Real Postgres
 * through @lockkit/pg.
 */
import 'reflect-metadata';
import { randomBytes } from 'node:crypto';
import { createLockKit } from '@lockkit/pg';
import { testDatabaseUrl } from '@lockkit/test-db';
import {
  Injectable,
  Module,
  type OnApplicationShutdown,
  type OnModuleDestroy,
} from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import pg from 'pg';
import { afterAll, beforeAll, expect, it } from 'vitest';
import {
  Exclusive,
  ExclusiveCron,
  exclusiveSignal,
  LockkitScheduleModule,
  LockkitScheduleService,
} from '../src/index.js';

const schema = `lockkit_nest_stop_${randomBytes(4).toString('hex')}`;
let admin: pg.Pool;

beforeAll(async () => {
  admin = new pg.Pool({ connectionString: testDatabaseUrl(), max: 2 });
  await createLockKit(admin, { schema }).migrate();
  await admin.query(`CREATE TABLE "${schema}".swept (batch int)`);
});
afterAll(async () => {
  await admin.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
  await admin.end();
});

it('close() waits for a running @Exclusive call, which learns of it, before the pool is ended', async () => {
  const pool = new pg.Pool({ connectionString: testDatabaseUrl(), max: 4 });
  const name = `drain-${randomBytes(3).toString('hex')}`;
  const steps: string[] = [];
  let entered!: () => void;
  const inside = new Promise<void>((resolve) => {
    entered = resolve;
  });
  @Injectable()
  class Sweep {
    @Exclusive({ name, namespace: schema })
    async run(): Promise<void> {
      const signal = exclusiveSignal();
      entered();
      await new Promise((resolve) => signal.addEventListener('abort', resolve, { once: true }));
      steps.push('sweep saw shutdown');
      // Finishing the batch in hand after the signal, through the application's pool.
      for (let batch = 1; batch <= 3; batch += 1) {
        await pool.query(`INSERT INTO "${schema}".swept VALUES ($1)`, [batch]);
      }
      steps.push('sweep finished');
    }
  }
  @Injectable()
  class Database implements OnApplicationShutdown {
    async onApplicationShutdown() {
      steps.push('pool ended');
      await pool.end();
    }
  }
  @Module({
    imports: [
      LockkitScheduleModule.forRoot({ lockKit: createLockKit(pool, { schema }), logger: false }),
    ],
    providers: [Sweep, Database],
  })
  class AppModule {}
  const context = await NestFactory.createApplicationContext(AppModule, { logger: false });
  await context.init();
  const call = context
    .get(Sweep)
    .run()
    .then(
      () => 'resolved',
      (e: unknown) => e,
    );
  await inside;
  await context.close();
  expect(await call).toBe('resolved');
  expect(steps).toEqual(['sweep saw shutdown', 'sweep finished', 'pool ended']);
  const rows = await admin.query(`SELECT count(*)::int AS n FROM "${schema}".swept`);
  expect(rows.rows).toEqual([{ n: 3 }]);
});

it('a call ignoring its signal holds shutdown no longer than stopTimeoutMs, and later calls are skipped', async () => {
  const pool = new pg.Pool({ connectionString: testDatabaseUrl(), max: 4 });
  const name = `stuck-${randomBytes(3).toString('hex')}`;
  let release!: () => void;
  const stuck = new Promise<void>((resolve) => {
    release = resolve;
  });
  let entered!: () => void;
  const inside = new Promise<void>((resolve) => {
    entered = resolve;
  });
  const order: string[] = [];
  @Injectable()
  class Sweep {
    @Exclusive({ name, namespace: schema })
    async run(): Promise<string | undefined> {
      entered();
      await stuck;
      return 'ran';
    }
  }
  @Injectable()
  class Witness implements OnModuleDestroy, OnApplicationShutdown {
    onModuleDestroy() {
      order.push('destroy');
    }
    onApplicationShutdown() {
      order.push('shutdown');
      // Released only after lockkit's drain gave up: the stuck call never blocked shutdown.
      release();
    }
  }
  @Module({
    imports: [
      LockkitScheduleModule.forRoot({
        lockKit: createLockKit(pool, { schema }),
        logger: false,
        stopTimeoutMs: 50,
      }),
    ],
    providers: [Sweep, Witness],
  })
  class AppModule {}
  const context = await NestFactory.createApplicationContext(AppModule, { logger: false });
  await context.init();
  const sweep = context.get(Sweep);
  const call = sweep.run();
  await inside;
  await context.close();
  expect(order).toEqual(['destroy', 'shutdown']);
  expect(await call).toBe('ran');
  // After shutdown began, a timer's call (as @nestjs/schedule may still fire one) is skipped.
  expect(await sweep.run()).toBeUndefined();
  await pool.end();
});

it('close() is bounded by stopTimeoutMs when the database stops answering, and when a stuck tick holds the only connection', async () => {
  // One connection: the stuck tick's transaction holds it, so the scheduler's clean-up cannot get one.
  const pool = new pg.Pool({ connectionString: testDatabaseUrl(), max: 1 });
  const name = `stuck-tick-${randomBytes(3).toString('hex')}`;
  let release!: () => void;
  const stuck = new Promise<void>((resolve) => {
    release = resolve;
  });
  let entered!: () => void;
  const inside = new Promise<void>((resolve) => {
    entered = resolve;
  });
  @Injectable()
  class Jobs {
    @ExclusiveCron('0 0 0 1 1 *', { name })
    async tick(): Promise<void> {
      entered();
      await stuck; // ignores its signal
    }
  }
  @Injectable()
  class Witness implements OnApplicationShutdown {
    onApplicationShutdown() {
      release(); // only once lockkit's drain has given up
    }
  }
  const blocker = await admin.connect();
  @Module({
    imports: [
      LockkitScheduleModule.forRoot({
        lockKit: createLockKit(pool, { schema }),
        logger: false,
        stopTimeoutMs: 100,
      }),
    ],
    providers: [Jobs, Witness],
  })
  class AppModule {}
  const context = await NestFactory.createApplicationContext(AppModule, { logger: false });
  await context.init();
  const work = context
    .get(LockkitScheduleService)
    .scheduler.runTick(name, new Date('2027-01-01T00:00:00Z'));
  await inside;
  // And the ledger does not answer: its schedules table is locked by another transaction.
  await blocker.query('BEGIN');
  await blocker.query(`LOCK TABLE "${schema}".schedules IN ACCESS EXCLUSIVE MODE`);
  try {
    await context.close();
  } finally {
    await blocker.query('ROLLBACK');
    blocker.release();
  }
  await work;
  await pool.end();
});
