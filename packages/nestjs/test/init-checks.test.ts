/**
 * Decorated methods the module once accepted and then silently never ran (or ran wrongly), each
 * now either working or refused with a typed error: transient providers, `@Cron()` beside
 * `@ExclusiveCron`, static, symbol-keyed, re-bound and re-wrapped methods, two `@ExclusiveCron` on
 * one method, bad `@Exclusive` options, a logger without its methods, a non-boolean `migrate`, and
 * an accessor. Real Nest application contexts against a real Postgres through @lockkit/pg.
 */
import 'reflect-metadata';
import { randomBytes } from 'node:crypto';
import { isLockkitError, type LockClient, type TransactionRun } from '@lockkit/core';
import { createLockKit } from '@lockkit/pg';
import { testDatabaseUrl } from '@lockkit/test-db';
import { Injectable, Module, Scope } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { Cron, Interval } from '@nestjs/schedule';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  Exclusive,
  ExclusiveCron,
  LockkitModuleError,
  LockkitScheduleModule,
  type LockkitScheduleModuleOptions,
  LockkitScheduleService,
} from '../src/index.js';

const schema = `lockkit_nest_init_${randomBytes(4).toString('hex')}`;
const TICK = new Date('2027-01-01T00:00:00Z');
const FAR = '0 0 0 1 1 *'; // 1 January: the timers never fire during a test; runTick drives ticks.
let pool: pg.Pool;
let locks: LockClient<pg.PoolClient, pg.PoolClient>;

beforeAll(async () => {
  pool = new pg.Pool({ connectionString: testDatabaseUrl(), max: 4 });
  locks = createLockKit(pool, { schema });
  await locks.migrate();
});
afterAll(async () => {
  await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
  await pool.end();
});

type Providers = (new (...args: never[]) => unknown)[];

/** An initialised application context of `providers` with the module configured by `options`. */
async function start(providers: Providers, options: Partial<LockkitScheduleModuleOptions> = {}) {
  @Module({
    imports: [LockkitScheduleModule.forRoot({ lockKit: locks, logger: false, ...options })],
    providers,
  })
  class AppModule {}
  const context = await NestFactory.createApplicationContext(AppModule, {
    logger: false,
    abortOnError: false,
  });
  await context.init();
  return context;
}

/** The rejection of starting such an application, as the LockkitModuleError it must be. */
async function initError(
  providers: Providers,
  options: Partial<LockkitScheduleModuleOptions> = {},
): Promise<LockkitModuleError> {
  const error: unknown = await start(providers, options).then(
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

/** What defining a class threw, as the LockkitModuleError it must be. */
function definitionError(define: () => unknown): LockkitModuleError {
  let error: unknown;
  try {
    define();
  } catch (e) {
    error = e;
  }
  expect(error).toBeInstanceOf(LockkitModuleError);
  expect((error as LockkitModuleError).message).not.toBe('');
  return error as LockkitModuleError;
}

/** A method decorator of another library that replaces the method with a wrapper, as many do. */
function Counted(counter: { calls: number }): MethodDecorator {
  return (_target, _key, descriptor: PropertyDescriptor) => {
    const inner = descriptor.value as (...args: unknown[]) => unknown;
    descriptor.value = function (this: unknown, ...args: unknown[]) {
      counter.calls += 1;
      return inner.apply(this, args);
    };
  };
}

const unique = (label: string) => `${label}-${randomBytes(3).toString('hex')}`;

describe('refused at init', () => {
  it('LockkitScheduleModule imported twice in one application (a library module brings its own)', async () => {
    const name = unique('two-modules');
    const runs: string[] = [];
    @Injectable()
    class Jobs {
      @ExclusiveCron(FAR, { name })
      run(run: TransactionRun<unknown>) {
        runs.push(run.tick.toISOString());
      }
    }
    @Module({
      imports: [
        LockkitScheduleModule.forRoot({
          lockKit: locks,
          logger: false,
          scheduler: { namespace: unique('lib') },
        }),
      ],
    })
    class LibModule {}
    @Module({
      imports: [LockkitScheduleModule.forRoot({ lockKit: locks, logger: false }), LibModule],
      providers: [Jobs],
    })
    class AppModule {}
    const started: unknown = await NestFactory.createApplicationContext(AppModule, {
      logger: false,
      abortOnError: false,
    }).then(
      async (context) => {
        await context.init();
        return context;
      },
      (e: unknown) => e,
    );
    if (!(started instanceof Error)) {
      // Accepted, every job sat on two schedulers, each with its own ledger: one replica ran
      // each tick twice.
      const context = started as Awaited<ReturnType<typeof NestFactory.createApplicationContext>>;
      for (const service of context.get(LockkitScheduleService, { each: true })) {
        await service.scheduler.runTick(name, TICK);
      }
      await context.close();
    }
    expect(runs).toEqual([]);
    expect(started).toBeInstanceOf(LockkitModuleError);
    expect((started as LockkitModuleError).reason).toBe('DUPLICATE_MODULE');
  });

  it('a decorated method in a transient provider (its instance never ran a constructor)', async () => {
    @Injectable({ scope: Scope.TRANSIENT })
    class Digest {
      @ExclusiveCron(FAR, { name: unique('transient') })
      run() {}
    }
    @Injectable({ scope: Scope.TRANSIENT })
    class GuardedDigest {
      @Exclusive({ name: unique('transient-guard') })
      async run(): Promise<void> {}
    }
    const cron = await initError([Digest]);
    expect(cron.reason).toBe('NOT_STATIC');
    expect(cron.message).toContain('Digest.run');
    expect((await initError([GuardedDigest])).reason).toBe('NOT_STATIC');
  });

  it('@Cron() or @Interval() on an @ExclusiveCron method, in either order', async () => {
    @Injectable()
    class CronBelow {
      @ExclusiveCron(FAR, { name: unique('both-a') })
      @Cron(FAR)
      run() {}
    }
    @Injectable()
    class CronAbove {
      @Cron(FAR)
      @ExclusiveCron(FAR, { name: unique('both-b') })
      run() {}
    }
    @Injectable()
    class IntervalToo {
      @Interval(3_600_000)
      @ExclusiveCron(FAR, { name: unique('both-c') })
      run() {}
    }
    for (const provider of [CronBelow, CronAbove, IntervalToo]) {
      const error = await initError([provider]);
      expect(error.reason, provider.name).toBe('OPTIONS_INVALID');
      expect(error.message).toContain(`${provider.name}.run`);
      expect(error.message).toContain('@nestjs/schedule');
    }
  });

  it('@Exclusive with a statementTimeoutMs core refuses, with core error as the cause', async () => {
    for (const statementTimeoutMs of [-5, 1.5, Number.NaN]) {
      @Injectable()
      class Guarded {
        @Exclusive({ name: unique('bad-timeout'), statementTimeoutMs })
        async sweep(): Promise<void> {}
      }
      const error = await initError([Guarded]);
      expect(error.reason).toBe('OPTIONS_INVALID');
      expect(error.message).toContain('Guarded.sweep');
      expect(isLockkitError(error.cause) && error.cause.code).toBe('OPTION_INVALID');
    }
  });

  it('a logger without log, warn and error methods', async () => {
    for (const logger of [{}, { log() {}, warn() {} }, 'console']) {
      const error = await initError([], { logger: logger as never });
      expect(error.reason).toBe('OPTIONS_INVALID');
      expect(error.message).toContain('logger');
    }
  });

  it('a migrate option that is not a boolean', async () => {
    const error = await initError([], { migrate: 'yes' as never });
    expect(error.reason).toBe('OPTIONS_INVALID');
    expect(error.message).toContain('migrate');
  });
});

describe('refused when the class is defined, with a message', () => {
  it('@ExclusiveCron or @Exclusive on a static method', () => {
    const cron = definitionError(() => {
      class Jobs {
        @ExclusiveCron(FAR, { name: 'static-cron' })
        static run() {}
        other() {}
      }
      return Jobs;
    });
    expect(cron.reason).toBe('OPTIONS_INVALID');
    expect(cron.message).toContain('static');
    const guard = definitionError(() => {
      class Jobs {
        @Exclusive({ name: 'static-guard' })
        static async run(): Promise<void> {}
        other() {}
      }
      return Jobs;
    });
    expect(guard.message).toContain('static');
  });

  it('@ExclusiveCron on an accessor', () => {
    const error = definitionError(() => {
      class Jobs {
        // Not a method: the compiler accepts the decorator here, so the decorator's check must refuse it.
        @ExclusiveCron(FAR, { name: 'getter' })
        get tick() {
          return 1;
        }
      }
      return Jobs;
    });
    expect(error.reason).toBe('OPTIONS_INVALID');
    expect(error.message).toContain('tick');
  });
});

describe('works', () => {
  it('@ExclusiveCron on a symbol-keyed, a re-bound and a re-wrapped method, and twice on one method', async () => {
    const names = {
      symbol: unique('symbol'),
      rebound: unique('rebound'),
      wrapped: unique('wrapped'),
      first: unique('first'),
      second: unique('second'),
    };
    const ran: string[] = [];
    const counter = { calls: 0 };
    const TICK_KEY = Symbol('tick');
    @Injectable()
    class Jobs {
      constructor() {
        this.rebound = this.rebound.bind(this);
      }
      @ExclusiveCron(FAR, { name: names.symbol })
      [TICK_KEY](run: TransactionRun<pg.PoolClient>) {
        ran.push(run.job);
      }
      @ExclusiveCron(FAR, { name: names.rebound })
      rebound(run: TransactionRun<pg.PoolClient>) {
        ran.push(run.job);
      }
      @Counted(counter)
      @ExclusiveCron(FAR, { name: names.wrapped })
      wrapped(run: TransactionRun<pg.PoolClient>) {
        ran.push(run.job);
      }
      @ExclusiveCron(FAR, { name: names.first })
      @ExclusiveCron(FAR, { name: names.second })
      twice(run: TransactionRun<pg.PoolClient>) {
        ran.push(run.job);
      }
    }
    const context = await start([Jobs]);
    try {
      const { scheduler } = context.get(LockkitScheduleService);
      for (const name of Object.values(names)) await scheduler.runTick(name, TICK);
    } finally {
      await context.close();
    }
    expect(ran).toEqual(Object.values(names));
    expect(counter.calls).toBe(1);
  });

  it('@Exclusive on a symbol-keyed, a re-bound and a re-wrapped method', async () => {
    const counter = { calls: 0 };
    const RUN = Symbol('run');
    @Injectable()
    class Guarded {
      constructor() {
        this.rebound = this.rebound.bind(this);
      }
      @Exclusive({ name: unique('g-symbol') })
      async [RUN](): Promise<string | undefined> {
        return 'symbol';
      }
      @Exclusive({ name: unique('g-rebound') })
      async rebound(): Promise<string | undefined> {
        return 'rebound';
      }
      @Counted(counter)
      @Exclusive({ name: unique('g-wrapped') })
      async wrapped(): Promise<string | undefined> {
        return 'wrapped';
      }
    }
    const context = await start([Guarded]);
    try {
      const guarded = context.get(Guarded);
      expect(await guarded[RUN]()).toBe('symbol');
      const { rebound } = guarded; // detached, as a callback would be
      expect(await rebound()).toBe('rebound');
      expect(await guarded.wrapped()).toBe('wrapped');
      expect(counter.calls).toBe(1);
    } finally {
      await context.close();
    }
  });
});
