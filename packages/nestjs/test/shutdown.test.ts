/**
 * Shutdown with `@Exclusive` calls running (review F6): `app.close()` aborts their
 * `exclusiveSignal()` and waits for them (up to `stopTimeoutMs`) before `onApplicationShutdown`,
 * where the README says to end the pool; and a call that ignores its signal does not hold
 * shutdown past `stopTimeoutMs`. Real Postgres through @lockkit/pg.
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
import { Exclusive, exclusiveSignal, LockkitScheduleModule } from '../src/index.js';

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
