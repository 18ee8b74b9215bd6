/**
 * The options of `LockkitScheduleModule.forRoot()` / `forRootAsync()`.
 *
 * @packageDocumentation
 */
import type { LockClient, SchedulerOptions } from '@lockkit/core';
import type { LoggerService, ModuleMetadata } from '@nestjs/common';

/** Options of {@link LockkitScheduleModule.forRoot}. */
export interface LockkitScheduleModuleOptions {
  /**
   * A ready lock client from any adapter (`createLockKit(pool)` of `@lockkit/pg`,
   * `@lockkit/postgres`, `@lockkit/drizzle`, …). The scheduler's ledger lives in its schema: run
   * `lockKit.migrate()` first, or set {@link LockkitScheduleModuleOptions.migrate}.
   */
  readonly lockKit: LockClient<unknown, unknown>;
  /** Options of the underlying scheduler (`namespace`, `owner`, `catchUpGraceMs`, `retentionMs`, `clock`, …). */
  readonly scheduler?: SchedulerOptions;
  /** Run `lockKit.migrate()` while the module initialises (safe from every replica at once). Default `false`. */
  readonly migrate?: boolean;
  /**
   * Where scheduler outcomes and skipped `@Exclusive` calls are logged: default a Nest `Logger`
   * named `Lockkit` (so it follows the application's logger and levels); your own `LoggerService`;
   * or `false` for nothing.
   */
  readonly logger?: LoggerService | false;
  /** How long shutdown waits for running jobs to end after aborting their signal. Default 10,000 ms. */
  readonly stopTimeoutMs?: number;
  /** Lock namespace of `@Exclusive` methods that name none. Default `'nestjs'`. */
  readonly exclusiveNamespace?: string;
}

/** Options of {@link LockkitScheduleModule.forRootAsync}: the options come from a factory with injected dependencies. */
export interface LockkitScheduleModuleAsyncOptions {
  /** Modules whose providers the factory injects. */
  readonly imports?: ModuleMetadata['imports'];
  /** Tokens injected into `useFactory`, in order. */
  readonly inject?: ReadonlyArray<string | symbol | (abstract new (...args: never[]) => unknown)>;
  /** Builds the options (may be async: e.g. create the pool, then the lock client). */
  readonly useFactory: (
    ...args: never[]
  ) => LockkitScheduleModuleOptions | Promise<LockkitScheduleModuleOptions>;
}

/** Injection token of the module's {@link LockkitScheduleModuleOptions}. */
export const LOCKKIT_SCHEDULE_OPTIONS = Symbol.for('lockkit:nestjs:options');
