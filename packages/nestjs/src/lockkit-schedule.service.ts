/**
 * The module's one provider: finds the decorated methods once the application's providers exist,
 * registers the `@ExclusiveCron` ones with a lockkit scheduler and binds the `@Exclusive` ones to
 * the lock client, then starts and stops the scheduler with the application's lifecycle.
 *
 * @packageDocumentation
 */
import { createScheduler, isLockkitError, type Scheduler } from '@lockkit/core';
import {
  type BeforeApplicationShutdown,
  Logger,
  type LoggerService,
  type OnApplicationBootstrap,
  type OnModuleDestroy,
  type OnModuleInit,
} from '@nestjs/common';
import type { DiscoveryService, MetadataScanner } from '@nestjs/core';
import { LockkitModuleError } from './errors.js';
import { logSchedulerEvents } from './event-logging.js';
import { exclusiveOf } from './exclusive.decorator.js';
import { bindExclusive } from './exclusive-binding.js';
import { exclusiveCronOf } from './exclusive-cron.decorator.js';
import type { LockkitScheduleModuleOptions } from './options.js';

/** A logger that drops everything (`logger: false`). */
const SILENT: LoggerService = { log() {}, error() {}, warn() {} };

/** `value` as a non-empty string, else a {@link LockkitModuleError} saying `problem`. */
function nonEmpty(value: unknown, problem: string): string {
  if (typeof value !== 'string' || value.length === 0)
    throw new LockkitModuleError('OPTIONS_INVALID', problem);
  return value;
}

/** Records that `owner` declares `id`; a second owner of one id is a {@link LockkitModuleError}. */
function claim(owners: Map<string, string>, id: string, label: string, owner: string): void {
  const previous = owners.get(id);
  if (previous !== undefined) {
    throw new LockkitModuleError(
      'DUPLICATE_NAME',
      `${label} is declared twice: by ${previous} and by ${owner}.`,
    );
  }
  owners.set(id, owner);
}

/** One decorated method found on one provider instance. */
interface FoundMethod {
  readonly owner: string;
  readonly instance: object;
  readonly key: string;
  readonly method: (...args: unknown[]) => unknown;
}

/**
 * Runs the application's `@ExclusiveCron` jobs and guards its `@Exclusive` methods. Inject it to
 * reach the underlying {@link LockkitScheduleService.scheduler} (its events, `runTick`).
 *
 * The scheduler starts on `onApplicationBootstrap` and stops on `onModuleDestroy` (or
 * `beforeApplicationShutdown`, whichever comes first): it stops firing ticks, aborts the signal of
 * running jobs and waits up to `stopTimeoutMs` for them; a run that ends by throwing on that signal
 * gives its tick back for another replica. Call `app.enableShutdownHooks()` so that SIGTERM closes
 * the application, and with it the scheduler.
 *
 * @example
 * ```ts
 * @Injectable()
 * export class Health {
 *   constructor(private readonly lockkit: LockkitScheduleService) {}
 *   runNow() { return this.lockkit.scheduler.runTick('issue-invoices', tick); }
 * }
 * ```
 */
export class LockkitScheduleService
  implements OnModuleInit, OnApplicationBootstrap, OnModuleDestroy, BeforeApplicationShutdown
{
  /** The lockkit scheduler running the `@ExclusiveCron` jobs. */
  readonly scheduler: Scheduler<unknown>;
  private readonly logger: LoggerService;
  private stopping: Promise<void> | undefined;

  /** @internal built by `LockkitScheduleModule` */
  constructor(
    private readonly options: LockkitScheduleModuleOptions,
    private readonly discovery: DiscoveryService,
    private readonly scanner: MetadataScanner,
  ) {
    const locks = options?.lockKit as unknown;
    if (
      typeof locks !== 'object' ||
      locks === null ||
      typeof (locks as { runExclusiveJob?: unknown }).runExclusiveJob !== 'function'
    ) {
      throw new LockkitModuleError(
        'OPTIONS_INVALID',
        'LockkitScheduleModule needs `lockKit`: a lock client from an adapter, e.g. createLockKit(pool) of @lockkit/pg.',
      );
    }
    const stopTimeoutMs: unknown = options.stopTimeoutMs;
    if (
      stopTimeoutMs !== undefined &&
      (typeof stopTimeoutMs !== 'number' || !Number.isInteger(stopTimeoutMs) || stopTimeoutMs < 0)
    ) {
      throw new LockkitModuleError(
        'OPTIONS_INVALID',
        `stopTimeoutMs must be a whole number of ms ≥ 0, got ${String(stopTimeoutMs)}.`,
      );
    }
    this.logger = options.logger === false ? SILENT : (options.logger ?? new Logger('Lockkit'));
    try {
      this.scheduler = createScheduler(options.lockKit, options.scheduler);
    } catch (cause) {
      throw new LockkitModuleError('OPTIONS_INVALID', `scheduler options: ${String(cause)}`, {
        cause,
      });
    }
    logSchedulerEvents(this.scheduler, this.logger);
  }

  /** Finds and checks every decorated method; bad input fails the application's start here. */
  async onModuleInit(): Promise<void> {
    const found = this.findMethods();
    this.registerJobs(found);
    this.bindGuards(found);
    if (this.options.migrate === true) await this.options.lockKit.migrate();
  }

  /** Starts firing ticks, once every module has initialised. */
  async onApplicationBootstrap(): Promise<void> {
    await this.scheduler.start();
  }

  /** Stops the scheduler and drains running jobs. */
  onModuleDestroy(): Promise<void> {
    return this.stop();
  }

  /** Stops the scheduler and drains running jobs (a no-op once stopped). */
  beforeApplicationShutdown(): Promise<void> {
    return this.stop();
  }

  private stop(): Promise<void> {
    this.stopping ??= this.scheduler
      .stop({ timeoutMs: this.options.stopTimeoutMs ?? 10_000 })
      .then(({ stillRunning }) => {
        if (stillRunning > 0)
          this.logger.warn(`stopped with ${stillRunning} job run(s) still going`);
      });
    return this.stopping;
  }

  private findMethods(): FoundMethod[] {
    const found: FoundMethod[] = [];
    const wrappers = [...this.discovery.getProviders(), ...this.discovery.getControllers()];
    const seen = new Set<object>();
    for (const wrapper of wrappers) {
      const instance: unknown = wrapper.instance;
      if (typeof instance !== 'object' || instance === null) continue;
      const prototype: unknown = Object.getPrototypeOf(instance);
      if (prototype === null || seen.has(instance)) continue;
      seen.add(instance);
      for (const key of this.scanner.getAllMethodNames(prototype as object)) {
        const method = (instance as Record<string, unknown>)[key];
        if (exclusiveCronOf(method) === undefined && exclusiveOf(method) === undefined) continue;
        const owner = `${wrapper.name === undefined ? 'provider' : String(wrapper.name)}.${key}`;
        if (!wrapper.isDependencyTreeStatic()) {
          throw new LockkitModuleError(
            'NOT_STATIC',
            `${owner} is decorated for lockkit but lives in a request- or transient-scoped provider: make it a singleton.`,
          );
        }
        found.push({
          owner,
          instance,
          key,
          method: method as FoundMethod['method'],
        });
      }
    }
    return found;
  }

  private registerJobs(found: readonly FoundMethod[]): void {
    const owners = new Map<string, string>();
    for (const { owner, instance, method } of found) {
      const job = exclusiveCronOf(method);
      if (job === undefined) continue;
      if (exclusiveOf(method) !== undefined) {
        throw new LockkitModuleError(
          'OPTIONS_INVALID',
          `${owner}: @ExclusiveCron already runs once per tick; remove @Exclusive.`,
        );
      }
      const name = nonEmpty(
        job.options?.name,
        `${owner}: @ExclusiveCron needs a non-empty { name }.`,
      );
      claim(owners, name, `job "${name}"`, owner);
      const { name: _name, ...jobOptions } = job.options;
      try {
        this.scheduler.register(name, job.cron, (run) => method.call(instance, run), jobOptions);
      } catch (cause) {
        const message = isLockkitError(cause) ? cause.message : String(cause);
        throw new LockkitModuleError('INVALID_JOB', `${owner}: ${message}`, { cause });
      }
    }
  }

  private bindGuards(found: readonly FoundMethod[]): void {
    const owners = new Map<string, string>();
    const namespace = nonEmpty(
      this.options.exclusiveNamespace ?? 'nestjs',
      'exclusiveNamespace must be a non-empty string.',
    );
    for (const { owner, instance, method } of found) {
      const guard = exclusiveOf(method);
      if (guard === undefined) continue;
      const name = nonEmpty(
        guard.options?.name,
        `${owner}: @Exclusive needs a non-empty { name }.`,
      );
      const lockNamespace = nonEmpty(
        guard.options.namespace ?? namespace,
        `${owner}: @Exclusive's namespace must be a non-empty string.`,
      );
      claim(owners, `${lockNamespace}\u0000${name}`, `lock "${name}"`, owner);
      bindExclusive(instance, {
        locks: this.options.lockKit,
        namespace,
        skipped: (lock) =>
          this.logger.verbose?.(`${lock}: skipped, another replica holds the lock`),
      });
    }
  }
}
