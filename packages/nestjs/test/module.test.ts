/**
 * The module in a real Nest application context, in this process, against a real Postgres
 * through @lockkit/pg: jobs found and registered at init, bad input refused at init, ticks run once
 * across two application instances ("replicas"), shutdown giving a running tick back, `@Exclusive`
 * beside @nestjs/schedule's `@Cron()` in either order, and outcomes reaching a Nest logger.
 */
import 'reflect-metadata';
import { randomBytes } from 'node:crypto';
import { isLockkitError, type LockClient, type TransactionRun } from '@lockkit/core';
import { createLockKit } from '@lockkit/pg';
import { testDatabaseUrl } from '@lockkit/test-db';
import { Injectable, type LoggerService, Module, Scope } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { Cron, Interval, ScheduleModule, SchedulerRegistry } from '@nestjs/schedule';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  Exclusive,
  ExclusiveCron,
  LockkitModuleError,
  LockkitScheduleModule,
  type LockkitScheduleModuleOptions,
  LockkitScheduleService,
  lockEventLogger,
} from '../src/index.js';

const schema = `lockkit_nest_${randomBytes(4).toString('hex')}`;
let pool: pg.Pool;
let locks: LockClient<pg.PoolClient, pg.PoolClient>;

beforeAll(async () => {
  pool = new pg.Pool({ connectionString: testDatabaseUrl(), max: 4 });
  locks = createLockKit(pool, { schema });
  await locks.migrate();
  await pool.query(`CREATE TABLE "${schema}".effects (job text, tick timestamptz, app text)`);
});
afterAll(async () => {
  await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
  await pool.end();
});

/** Every line a logger was given, with its level. */
class RecordingLogger implements LoggerService {
  readonly lines: { level: string; message: string }[] = [];
  log(message: unknown) {
    this.lines.push({ level: 'log', message: String(message) });
  }
  error(message: unknown) {
    this.lines.push({ level: 'error', message: String(message) });
  }
  warn(message: unknown) {
    this.lines.push({ level: 'warn', message: String(message) });
  }
  debug(message: unknown) {
    this.lines.push({ level: 'debug', message: String(message) });
  }
  verbose(message: unknown) {
    this.lines.push({ level: 'verbose', message: String(message) });
  }
}

/** A Nest application context of `providers` with the module configured by `options`. */
async function app(
  providers: (new (...args: never[]) => unknown)[],
  options: Partial<LockkitScheduleModuleOptions> = {},
  imports: unknown[] = [],
) {
  @Module({
    imports: [
      LockkitScheduleModule.forRoot({ lockKit: locks, logger: false, ...options }),
      ...(imports as []),
    ],
    providers,
  })
  class AppModule {}
  return NestFactory.createApplicationContext(AppModule, { logger: false, abortOnError: false });
}

/** A failed `init` rejection, as the LockkitModuleError it must be. */
async function initError(
  providers: (new (...args: never[]) => unknown)[],
): Promise<LockkitModuleError> {
  const error: unknown = await app(providers).then(
    async (context) => {
      await context.close();
      return undefined;
    },
    (e: unknown) => e,
  );
  expect(error).toBeInstanceOf(LockkitModuleError);
  expect(isLockkitError(error) && error.code).toBe('OPTION_INVALID');
  return error as LockkitModuleError;
}

const tickRows = async (job: string) =>
  (
    await pool.query<{ tick: Date; app: string }>(
      `SELECT tick, app FROM "${schema}".effects WHERE job = $1 ORDER BY tick`,
      [job],
    )
  ).rows;

describe('@ExclusiveCron', () => {
  it('runs one tick once across two application instances, the write committed with the ledger row', async () => {
    const job = `once-${randomBytes(3).toString('hex')}`;
    @Injectable()
    class Jobs {
      static appName = '';
      // The far future: the timers never fire during the test; runTick drives the ticks.
      @ExclusiveCron('0 0 0 1 1 *', { name: job, timezone: 'Europe/Oslo' })
      async tick(run: TransactionRun<pg.PoolClient>) {
        await run.tx.query(`INSERT INTO "${schema}".effects VALUES ($1, $2, $3)`, [
          job,
          run.tick,
          this.constructor.name,
        ]);
      }
    }
    const a = await app([Jobs]);
    const b = await app([Jobs]);
    await Promise.all([a.init(), b.init()]);
    try {
      const tick = new Date('2026-12-31T23:00:00Z'); // 00:00 on 1 January in Oslo
      const services = [a, b].map((c) => c.get(LockkitScheduleService));
      await Promise.all(services.map((s) => s.scheduler.runTick(job, tick)));
      await Promise.all(services.map((s) => s.scheduler.runTick(job, tick)));
      expect((await tickRows(job)).map((r) => r.tick.toISOString())).toEqual([tick.toISOString()]);
      const ledger = await pool.query(`SELECT status FROM "${schema}".runs WHERE job = $1`, [job]);
      expect(ledger.rows).toEqual([{ status: 'SUCCEEDED' }]);
    } finally {
      await Promise.all([a.close(), b.close()]);
    }
  });

  it('starts firing on bootstrap: a per-second job runs by its own timer', async () => {
    const job = `timer-${randomBytes(3).toString('hex')}`;
    let ran!: (tick: Date) => void;
    const first = new Promise<Date>((resolve) => {
      ran = resolve;
    });
    @Injectable()
    class Jobs {
      @ExclusiveCron('* * * * * *', { name: job })
      tick(run: TransactionRun<pg.PoolClient>) {
        ran(run.tick);
      }
    }
    const context = await app([Jobs]);
    await context.init();
    try {
      const tick = await first;
      expect(tick.getMilliseconds()).toBe(0);
    } finally {
      await context.close();
    }
  });

  it('gives a running tick back on close: its signal aborts, the ledger holds it PENDING for the next replica', async () => {
    const job = `drain-${randomBytes(3).toString('hex')}`;
    let started!: () => void;
    const running = new Promise<void>((resolve) => {
      started = resolve;
    });
    @Injectable()
    class Jobs {
      @ExclusiveCron('0 0 0 1 1 *', { name: job })
      async tick(run: TransactionRun<pg.PoolClient>) {
        started();
        await new Promise((_resolve, reject) => {
          run.signal.addEventListener('abort', () => reject(run.signal.reason), { once: true });
        });
      }
    }
    const context = await app([Jobs]);
    await context.init();
    const tick = new Date('2027-01-01T00:00:00Z');
    const work = context.get(LockkitScheduleService).scheduler.runTick(job, tick);
    await running;
    await context.close();
    await work;
    const ledger = await pool.query(`SELECT status FROM "${schema}".runs WHERE job = $1`, [job]);
    expect(ledger.rows).toEqual([{ status: 'PENDING' }]);
  });

  it('refuses an invalid cron expression at init, naming the method', async () => {
    @Injectable()
    class Broken {
      @ExclusiveCron('61 * * * * *', { name: 'broken' })
      tick() {}
    }
    const error = await initError([Broken]);
    expect(error.reason).toBe('INVALID_JOB');
    expect(error.message).toContain('Broken.tick');
    expect(isLockkitError(error.cause) && error.cause.code).toBe('OPTION_INVALID');
  });

  it('refuses one name on two methods at init', async () => {
    @Injectable()
    class First {
      @ExclusiveCron('0 * * * * *', { name: 'twice' })
      tick() {}
    }
    @Injectable()
    class Second {
      @ExclusiveCron('30 * * * * *', { name: 'twice' })
      tock() {}
    }
    const error = await initError([First, Second]);
    expect(error.reason).toBe('DUPLICATE_NAME');
    expect(error.message).toContain('First.tick');
    expect(error.message).toContain('Second.tock');
  });

  it('refuses a job in a request-scoped provider at init', async () => {
    @Injectable({ scope: Scope.REQUEST })
    class PerRequest {
      @ExclusiveCron('0 * * * * *', { name: 'per-request' })
      tick() {}
    }
    expect((await initError([PerRequest])).reason).toBe('NOT_STATIC');
  });

  it('logs a failed tick at error level through the given logger', async () => {
    const job = `fails-${randomBytes(3).toString('hex')}`;
    @Injectable()
    class Jobs {
      @ExclusiveCron('0 0 0 1 1 *', { name: job })
      tick() {
        throw new Error('boom');
      }
    }
    const logger = new RecordingLogger();
    const context = await app([Jobs], { logger });
    await context.init();
    try {
      await context
        .get(LockkitScheduleService)
        .scheduler.runTick(job, new Date('2027-01-01T00:00:00Z'));
    } finally {
      await context.close();
    }
    const errors = logger.lines.filter((l) => l.level === 'error');
    expect(errors).toHaveLength(1);
    expect(errors[0]?.message).toMatch(
      new RegExp(`^${job} @ 2027-01-01T00:00:00.000Z failed \\(attempt 1\\): Error: boom$`),
    );
  });
});

describe('@Exclusive', () => {
  it('keeps @Cron()/@Interval() metadata in either order, so @nestjs/schedule still schedules the method', async () => {
    @Injectable()
    class Guarded {
      @Cron('0 0 0 1 1 *', { name: 'cron-above' })
      @Exclusive({ name: 'cron-above' })
      above() {}

      @Exclusive({ name: 'cron-below' })
      @Cron('0 0 0 1 1 *', { name: 'cron-below' })
      below() {}

      @Exclusive({ name: 'interval-below' })
      @Interval('interval-below', 3_600_000)
      every() {}
    }
    const context = await app([Guarded], {}, [ScheduleModule.forRoot()]);
    await context.init();
    try {
      const registry = context.get(SchedulerRegistry);
      expect([...registry.getCronJobs().keys()].sort()).toEqual(['cron-above', 'cron-below']);
      expect(registry.getIntervals()).toEqual(['interval-below']);
    } finally {
      await context.close();
    }
  });

  it('runs the method only while no other replica holds the lock, and says so at verbose level', async () => {
    const name = `guard-${randomBytes(3).toString('hex')}`;
    let calls = 0;
    @Injectable()
    class Guarded {
      @Exclusive({ name, namespace: schema })
      async work(n: number): Promise<number | undefined> {
        calls += 1;
        return n * 2;
      }
    }
    const logger = new RecordingLogger();
    const context = await app([Guarded], { logger });
    await context.init();
    try {
      const guarded = context.get(Guarded);
      expect(await guarded.work(21)).toBe(42);
      // Another replica holds the lock: the call is skipped at once, the method never entered.
      let release!: () => void;
      let held!: () => void;
      const holding = new Promise<void>((resolve) => {
        held = resolve;
      });
      const other = locks.runExclusiveJob(schema, name, async () => {
        held();
        await new Promise<void>((resolve) => {
          release = resolve;
        });
      });
      await holding;
      expect(await guarded.work(1)).toBeUndefined();
      expect(calls).toBe(1);
      release();
      expect((await other).executed).toBe(true);
      expect(await guarded.work(2)).toBe(4);
      expect(calls).toBe(2);
      expect(logger.lines).toContainEqual({
        level: 'verbose',
        message: `${name}: skipped, another replica holds the lock`,
      });
    } finally {
      await context.close();
    }
  });

  it('refuses a call on an instance the module never saw', async () => {
    class Unbound {
      @Exclusive({ name: 'unbound' })
      async work(): Promise<number | undefined> {
        return 1;
      }
    }
    const error: unknown = await new Unbound().work().then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(error).toBeInstanceOf(LockkitModuleError);
    expect((error as LockkitModuleError).reason).toBe('NOT_BOUND');
  });

  it('is refused at compile time on a method whose promise cannot resolve undefined', () => {
    class Typed {
      // @ts-expect-error a skipped call resolves undefined, which Promise<number> does not admit
      @Exclusive({ name: 'typed' })
      async count(): Promise<number> {
        return 1;
      }
      @Exclusive({ name: 'typed-ok' })
      async maybe(): Promise<number | undefined> {
        return 1;
      }
    }
    expect(typeof new Typed().maybe).toBe('function');
  });

  it('refuses an empty lock namespace at init', async () => {
    @Injectable()
    class Guarded {
      @Exclusive({ name: 'nowhere', namespace: '' })
      one() {}
    }
    const error = await initError([Guarded]);
    expect(error.reason).toBe('OPTIONS_INVALID');
    expect(error.message).toContain('Guarded.one');
  });

  it('refuses one lock name on two methods at init', async () => {
    @Injectable()
    class Twice {
      @Exclusive({ name: 'same' })
      one() {}
      @Exclusive({ name: 'same' })
      two() {}
    }
    expect((await initError([Twice])).reason).toBe('DUPLICATE_NAME');
  });
});

describe('LockkitScheduleModule', () => {
  it('forRootAsync builds its options from injected providers, and migrate: true creates the ledger', async () => {
    const fresh = `lockkit_nest_async_${randomBytes(4).toString('hex')}`;
    const job = 'async-job';
    const SETTINGS = Symbol('settings');
    @Module({
      providers: [{ provide: SETTINGS, useValue: { schema: fresh } }],
      exports: [SETTINGS],
    })
    class SettingsModule {}
    const ran: Date[] = [];
    @Injectable()
    class Jobs {
      @ExclusiveCron('0 0 0 1 1 *', { name: job })
      tick(run: TransactionRun<pg.PoolClient>) {
        ran.push(run.tick);
      }
    }
    @Module({
      imports: [
        LockkitScheduleModule.forRootAsync({
          imports: [SettingsModule],
          inject: [SETTINGS],
          useFactory: async (settings: { schema: string }) => ({
            lockKit: createLockKit(pool, { schema: settings.schema }),
            migrate: true,
            logger: false,
          }),
        }),
      ],
      providers: [Jobs],
    })
    class AppModule {}
    const context = await NestFactory.createApplicationContext(AppModule, { logger: false });
    try {
      await context.init();
      const tick = new Date('2027-01-01T00:00:00Z');
      await context.get(LockkitScheduleService).scheduler.runTick(job, tick);
      expect(ran).toEqual([tick]);
      const ledger = await pool.query(`SELECT status FROM "${fresh}".runs WHERE job = $1`, [job]);
      expect(ledger.rows).toEqual([{ status: 'SUCCEEDED' }]);
    } finally {
      await context.close();
      await pool.query(`DROP SCHEMA IF EXISTS "${fresh}" CASCADE`);
    }
  });

  it('refuses options without a lock client at init', async () => {
    @Module({
      imports: [
        LockkitScheduleModule.forRoot({
          lockKit: undefined as unknown as LockClient<unknown, unknown>,
        }),
      ],
    })
    class AppModule {}
    const error: unknown = await NestFactory.createApplicationContext(AppModule, {
      logger: false,
      abortOnError: false,
    }).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(error).toBeInstanceOf(LockkitModuleError);
    expect((error as LockkitModuleError).reason).toBe('OPTIONS_INVALID');
  });

  it('refuses a stopTimeoutMs that is not a whole number of ms at init', async () => {
    for (const stopTimeoutMs of [-1, 1.5, Number.NaN]) {
      const error: unknown = await app([], { stopTimeoutMs }).then(
        async (context) => {
          await context.close();
          return undefined;
        },
        (e: unknown) => e,
      );
      expect(error, `stopTimeoutMs ${stopTimeoutMs}`).toBeInstanceOf(LockkitModuleError);
      expect((error as LockkitModuleError).reason).toBe('OPTIONS_INVALID');
    }
  });

  it('lockEventLogger reports the locks under an @Exclusive call at verbose level', async () => {
    const logger = new RecordingLogger();
    const observed = createLockKit(pool, { schema, onEvent: lockEventLogger(logger) });
    const name = `logged-${randomBytes(3).toString('hex')}`;
    @Injectable()
    class Guarded {
      @Exclusive({ name })
      async work(): Promise<void> {}
    }
    const context = await app([Guarded], { lockKit: observed });
    await context.init();
    try {
      await context.get(Guarded).work();
    } finally {
      await context.close();
    }
    expect(logger.lines.map((l) => `${l.level} ${l.message.split(' ')[0]}`)).toEqual([
      'verbose lock-attempt',
      'verbose lock-acquired',
      'verbose lock-released',
    ]);
  });
});
