/**
 * The module's one provider: finds the decorated methods once the application's providers exist,
 * registers the `@ExclusiveCron` ones with a lockkit scheduler and binds the `@Exclusive` ones to
 * the lock client, then starts and stops the scheduler with the application's lifecycle.
 *
 * @packageDocumentation
 */
import { createScheduler, isLockkitError, LockkitError, type Scheduler } from '@lockkit/core';
import { checkMilliseconds } from '@lockkit/core/adapter';
import {
  type BeforeApplicationShutdown,
  Logger,
  type LoggerService,
  type OnApplicationBootstrap,
  type OnModuleDestroy,
  type OnModuleInit,
} from '@nestjs/common';
import type { DiscoveryService } from '@nestjs/core';
import type { MethodDeclaration } from './class-declarations.js';
import { LockkitModuleError } from './errors.js';
import { logSchedulerEvents } from './event-logging.js';
import { type ExclusiveMetadata, exclusivesOf } from './exclusive.decorator.js';
import { bindExclusive } from './exclusive-binding.js';
import { type ExclusiveCronMetadata, exclusiveCronsOf } from './exclusive-cron.decorator.js';
import type { LockkitScheduleModuleOptions } from './options.js';

/** A logger that drops everything (`logger: false`). */
const SILENT: LoggerService = { log() {}, error() {}, warn() {} };

/** The metadata key `@Cron()`, `@Interval()` and `@Timeout()` of `@nestjs/schedule` write on a method. */
const NEST_SCHEDULE_TYPE = 'SCHEDULER_TYPE';

/** `logger` as a Nest logger, else a {@link LockkitModuleError}: a logger without `log`, `warn` and `error` would drop failures. */
function loggerOf(logger: unknown): LoggerService {
  const methods = ['log', 'warn', 'error'] as const;
  if (
    typeof logger !== 'object' ||
    logger === null ||
    methods.some((m) => typeof (logger as Record<string, unknown>)[m] !== 'function')
  ) {
    throw new LockkitModuleError(
      'OPTIONS_INVALID',
      'logger must be a Nest LoggerService (with log, warn and error methods) or false.',
    );
  }
  return logger as LoggerService;
}

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

/** The decorated methods found on one singleton provider instance. */
interface FoundInstance {
  /** The provider's name, for messages. */
  readonly name: string;
  readonly instance: object;
  readonly crons: readonly MethodDeclaration<ExclusiveCronMetadata>[];
  readonly guards: readonly MethodDeclaration<ExclusiveMetadata>[];
}

/**
 * Runs the application's `@ExclusiveCron` jobs and guards its `@Exclusive` methods. Inject it to
 * reach the underlying {@link LockkitScheduleService.scheduler} (its events, `runTick`).
 *
 * The scheduler starts on `onApplicationBootstrap` and stops on `onModuleDestroy` (or
 * `beforeApplicationShutdown`, whichever comes first): it stops firing ticks, aborts the signal of
 * running jobs and of running `@Exclusive` calls (`exclusiveSignal()`), and waits for them — the
 * whole stop takes at most `stopTimeoutMs`; a run that ends by throwing on that signal gives its
 * tick back, run with the job's next tick. End your pool in `onApplicationShutdown`, which Nest
 * calls after this drain (other modules' `onModuleDestroy` run before it). Call
 * `app.enableShutdownHooks()` so that SIGTERM closes the application, and with it the scheduler.
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
  /** Aborted when shutdown begins: the signal of every `@Exclusive` call's lock. */
  private readonly guardsStopping = new AbortController();
  /** `@Exclusive` calls still running. */
  private readonly calls = new Set<Promise<unknown>>();

  /** @internal built by `LockkitScheduleModule` */
  constructor(
    private readonly options: LockkitScheduleModuleOptions,
    private readonly discovery: DiscoveryService,
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
    if (options.migrate !== undefined && typeof options.migrate !== 'boolean') {
      throw new LockkitModuleError(
        'OPTIONS_INVALID',
        `migrate must be true or false, got ${String(options.migrate)}.`,
      );
    }
    this.logger =
      options.logger === false
        ? SILENT
        : options.logger === undefined
          ? new Logger('Lockkit')
          : loggerOf(options.logger);
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
    this.refuseAnotherModule();
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
    this.stopping ??= this.drain();
    return this.stopping;
  }

  /**
   * Aborts the signal of running jobs and `@Exclusive` calls, then waits for both up to
   * `stopTimeoutMs` (the scheduler's own clean-up is bounded by the same time).
   */
  private async drain(): Promise<void> {
    const timeoutMs = this.options.stopTimeoutMs ?? 10_000;
    this.guardsStopping.abort(new LockkitError('ABORTED', 'the application is shutting down'));
    let timer: ReturnType<typeof setTimeout> | undefined;
    const deadline = new Promise<'timeout'>((resolve) => {
      timer = setTimeout(resolve, timeoutMs, 'timeout');
    });
    const calls = Promise.allSettled([...this.calls]);
    const [jobs, guarded] = await Promise.all([
      this.scheduler.stop({ timeoutMs }).then(({ stillRunning }) => stillRunning),
      Promise.race([calls, deadline]).then(() => this.calls.size),
    ]);
    clearTimeout(timer);
    if (jobs > 0) this.logger.warn(`stopped with ${jobs} job run(s) still going`);
    if (guarded > 0) this.logger.warn(`stopped with ${guarded} @Exclusive call(s) still going`);
  }

  /** Counts `call` as running until it settles. */
  private track<T>(call: Promise<T>): Promise<T> {
    this.calls.add(call);
    const forget = () => this.calls.delete(call);
    call.then(forget, forget);
    return call;
  }

  /**
   * Each copy of the module finds every decorated method of the application and runs it on its
   * own scheduler: with two copies (a library module importing its own `forRoot`, say), a job
   * whose copies keep separate ledgers (another `scheduler.namespace` or schema) ran each tick
   * twice, and the later copy took over every `@Exclusive` binding. Refused at start-up.
   */
  private refuseAnotherModule(): void {
    const services = new Set<object>();
    for (const wrapper of this.discovery.getProviders()) {
      const instance: unknown = wrapper.instance;
      if (wrapper.token === LockkitScheduleService && typeof instance === 'object' && instance)
        services.add(instance);
    }
    if (services.size > 1) {
      throw new LockkitModuleError(
        'DUPLICATE_MODULE',
        `LockkitScheduleModule is imported ${services.size} times in this application: each copy would run every @ExclusiveCron job on its own scheduler. Import it once, in the root module (it is global: other modules inject LockkitScheduleService from there).`,
      );
    }
  }

  private findMethods(): FoundInstance[] {
    const found: FoundInstance[] = [];
    const wrappers = [...this.discovery.getProviders(), ...this.discovery.getControllers()];
    const seen = new Set<object>();
    for (const wrapper of wrappers) {
      const instance: unknown = wrapper.instance;
      if (typeof instance !== 'object' || instance === null || seen.has(instance)) continue;
      seen.add(instance);
      const crons = exclusiveCronsOf(instance);
      const guards = exclusivesOf(instance);
      if (crons.length === 0 && guards.length === 0) continue;
      const name = wrapper.name === undefined ? 'provider' : String(wrapper.name);
      // A transient provider's wrapper holds a prototype-made object whose constructor never ran;
      // a request-scoped one has no instance outside a request.
      if (wrapper.isTransient || !wrapper.isDependencyTreeStatic()) {
        const key = (crons[0] ?? guards[0])?.key;
        throw new LockkitModuleError(
          'NOT_STATIC',
          `${name}.${String(key)} is decorated for lockkit but lives in a request- or transient-scoped provider: make it a singleton.`,
        );
      }
      found.push({ name, instance, crons, guards });
    }
    return found;
  }

  private registerJobs(found: readonly FoundInstance[]): void {
    const owners = new Map<string, string>();
    for (const { name: provider, instance, crons, guards } of found) {
      for (const { key, method: declared, value: job } of crons) {
        const owner = `${provider}.${String(key)}`;
        if (guards.some((guard) => guard.key === key)) {
          throw new LockkitModuleError(
            'OPTIONS_INVALID',
            `${owner}: @ExclusiveCron already runs once per tick; remove @Exclusive.`,
          );
        }
        // The method as the instance has it now: re-bound in the constructor, or wrapped by a
        // decorator applied after ours.
        const method: unknown = Reflect.get(instance, key);
        if (typeof method !== 'function') {
          throw new LockkitModuleError(
            'OPTIONS_INVALID',
            `${owner}: the instance has no method there any more (it was replaced by ${typeof method}).`,
          );
        }
        if (
          Reflect.getMetadata(NEST_SCHEDULE_TYPE, declared) !== undefined ||
          Reflect.getMetadata(NEST_SCHEDULE_TYPE, method) !== undefined
        ) {
          throw new LockkitModuleError(
            'OPTIONS_INVALID',
            `${owner}: @nestjs/schedule's @Cron()/@Interval()/@Timeout() would also run it on every replica, unguarded; keep only @ExclusiveCron.`,
          );
        }
        const name = nonEmpty(
          job.options?.name,
          `${owner}: @ExclusiveCron needs a non-empty { name }.`,
        );
        claim(owners, name, `job "${name}"`, owner);
        const { name: _name, ...jobOptions } = job.options;
        try {
          this.scheduler.register(
            name,
            job.cron,
            (run) => (method as (run: unknown) => unknown).call(instance, run),
            jobOptions,
          );
        } catch (cause) {
          const message = isLockkitError(cause) ? cause.message : String(cause);
          throw new LockkitModuleError('INVALID_JOB', `${owner}: ${message}`, { cause });
        }
      }
    }
  }

  private bindGuards(found: readonly FoundInstance[]): void {
    const owners = new Map<string, string>();
    const namespace = nonEmpty(
      this.options.exclusiveNamespace ?? 'nestjs',
      'exclusiveNamespace must be a non-empty string.',
    );
    for (const { name: provider, instance, guards } of found) {
      if (guards.length === 0) continue;
      for (const { key, value: guard } of guards) {
        const owner = `${provider}.${String(key)}`;
        const name = nonEmpty(
          guard.options?.name,
          `${owner}: @Exclusive needs a non-empty { name }.`,
        );
        const lockNamespace = nonEmpty(
          guard.options.namespace ?? namespace,
          `${owner}: @Exclusive's namespace must be a non-empty string.`,
        );
        if (guard.options.statementTimeoutMs !== undefined) {
          try {
            checkMilliseconds(guard.options.statementTimeoutMs, 'statementTimeoutMs', 0);
          } catch (cause) {
            const message = isLockkitError(cause) ? cause.message : String(cause);
            throw new LockkitModuleError('OPTIONS_INVALID', `${owner}: @Exclusive ${message}`, {
              cause,
            });
          }
        }
        claim(owners, `${lockNamespace}\u0000${name}`, `lock "${name}"`, owner);
      }
      bindExclusive(instance, {
        locks: this.options.lockKit,
        namespace,
        skipped: (lock, why) => this.logger.verbose?.(`${lock}: skipped, ${why}`),
        stopping: this.guardsStopping.signal,
        track: (call) => this.track(call),
      });
    }
  }
}
