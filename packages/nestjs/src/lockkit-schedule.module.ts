/**
 * `LockkitScheduleModule`: the Nest module that runs `@ExclusiveCron` methods once per tick across
 * replicas and guards `@Exclusive` methods.
 *
 * @packageDocumentation
 */
import { type DynamicModule, type FactoryProvider, Module } from '@nestjs/common';
import { DiscoveryModule, DiscoveryService, MetadataScanner } from '@nestjs/core';
import { LockkitScheduleService } from './lockkit-schedule.service.js';
import {
  LOCKKIT_SCHEDULE_OPTIONS,
  type LockkitScheduleModuleAsyncOptions,
  type LockkitScheduleModuleOptions,
} from './options.js';

const serviceProvider: FactoryProvider<LockkitScheduleService> = {
  provide: LockkitScheduleService,
  useFactory: (
    options: LockkitScheduleModuleOptions,
    discovery: DiscoveryService,
    scanner: MetadataScanner,
  ) => new LockkitScheduleService(options, discovery, scanner),
  inject: [LOCKKIT_SCHEDULE_OPTIONS, DiscoveryService, MetadataScanner],
};

/**
 * Import once, in the root module, with a lock client from any adapter. Every singleton provider
 * and controller of the application is searched for `@ExclusiveCron` and `@Exclusive` methods;
 * `LockkitScheduleService` is exported (and the module is global) for code that wants the
 * scheduler itself. Works beside `ScheduleModule.forRoot()` of `@nestjs/schedule`, which is only
 * needed for the `@Cron()` / `@Interval()` methods you guard with `@Exclusive`.
 *
 * @example
 * ```ts
 * const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL });
 * @Module({
 *   imports: [LockkitScheduleModule.forRoot({ lockKit: createLockKit(pool), migrate: true })],
 *   providers: [Billing],
 * })
 * export class AppModule {}
 * ```
 */
// biome-ignore lint/complexity/noStaticOnlyClass: a Nest module is a class; forRoot()/forRootAsync() are the Nest convention.
export class LockkitScheduleModule {
  /** The module with options known up front. */
  static forRoot(options: LockkitScheduleModuleOptions): DynamicModule {
    return {
      module: LockkitScheduleModule,
      global: true,
      imports: [DiscoveryModule],
      providers: [{ provide: LOCKKIT_SCHEDULE_OPTIONS, useValue: options }, serviceProvider],
      exports: [LockkitScheduleService],
    };
  }

  /**
   * The module with options built by a factory that injects other providers (configuration, a
   * pool provider).
   *
   * @example
   * ```ts
   * LockkitScheduleModule.forRootAsync({
   *   inject: [ConfigService],
   *   useFactory: (config: ConfigService) => ({
   *     lockKit: createLockKit(new pg.Pool({ connectionString: config.get('DATABASE_URL') })),
   *   }),
   * })
   * ```
   */
  static forRootAsync(options: LockkitScheduleModuleAsyncOptions): DynamicModule {
    return {
      module: LockkitScheduleModule,
      global: true,
      imports: [DiscoveryModule, ...(options.imports ?? [])],
      providers: [
        {
          provide: LOCKKIT_SCHEDULE_OPTIONS,
          useFactory: options.useFactory as (...args: unknown[]) => unknown,
          inject: [...(options.inject ?? [])],
        },
        serviceProvider,
      ],
      exports: [LockkitScheduleService],
    };
  }
}

// A dynamic module's class still carries `@Module()` metadata, written here without decorator
// syntax so that the package builds with no decorator transform.
Module({})(LockkitScheduleModule);
