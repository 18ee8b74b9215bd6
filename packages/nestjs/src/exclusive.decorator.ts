/**
 * `@Exclusive({ name })`: guards an existing method — typically an `@nestjs/schedule` `@Cron()` or
 * `@Interval()` method — with a lockkit advisory lock, so that no two replicas run it at the same
 * time.
 *
 * @packageDocumentation
 */
import 'reflect-metadata';
import type { ExclusiveJobOptions } from '@lockkit/core';
import { LockkitModuleError } from './errors.js';
import { exclusiveBindingOf } from './exclusive-binding.js';
import { EXCLUSIVE_KEY } from './metadata-keys.js';

/** Options of {@link Exclusive}. */
export interface ExclusiveOptions {
  /** The lock's name: every replica must use the same one for the same method. */
  readonly name: string;
  /** Lock namespace (default: the module's `exclusiveNamespace`, itself `'nestjs'` by default). */
  readonly namespace?: string;
  /** `statement_timeout` of the lock's transaction while the method runs. */
  readonly statementTimeoutMs?: ExclusiveJobOptions['statementTimeoutMs'];
}

/** What `@Exclusive` records on the wrapped method. @internal */
export interface ExclusiveMetadata {
  readonly options: ExclusiveOptions;
}

type AnyMethod = (this: unknown, ...args: unknown[]) => unknown;

/**
 * The decorator {@link Exclusive} returns. It accepts methods returning `void` (their result is
 * not used) and methods returning a promise that may resolve `undefined` (`Promise<void>`,
 * `Promise<Report | undefined>`), because a guarded call is asynchronous and resolves `undefined`
 * when another replica held the lock. A method typed `Promise<Report>` is refused at compile time.
 */
export interface ExclusiveMethodDecorator {
  /** On a method whose result is not used. */
  <A extends unknown[]>(
    target: object,
    key: string | symbol,
    descriptor: TypedPropertyDescriptor<(...args: A) => void>,
  ): void;
  /** On a method whose promise may resolve `undefined`. */
  <A extends unknown[], R>(
    target: object,
    key: string | symbol,
    descriptor: TypedPropertyDescriptor<(...args: A) => Promise<R | undefined>>,
  ): void;
}

/**
 * Wraps the decorated method so that each call runs only if this replica gets the lock `name`
 * at once (lockkit's `runExclusiveJob`: a transaction-scoped advisory lock, released when the
 * method settles or its connection dies). A replica that finds the lock held skips the call
 * without waiting: the call resolves `undefined` and the skip is logged at `verbose`.
 *
 * What this promises is **never at the same time**, not once per tick: a replica whose timer fires
 * after another replica has already finished the same tick finds the lock free and runs it again
 * (a fast job, clocks a few hundred ms apart, or `@Interval` timers that are not aligned across
 * replicas). For once per tick, use {@link ExclusiveCron}, whose ledger records each tick.
 *
 * Order with `@Cron()` / `@Interval()` does not matter: metadata already on the method is copied
 * onto the wrapper. Every call is guarded, also a direct call from your own code. The method does
 * not see the lock's transaction; its own database work uses its own connections. Needs
 * `LockkitScheduleModule` in the application, and the method's class to be a singleton provider
 * or controller; a name used twice fails the application's start with {@link LockkitModuleError}.
 *
 * @example
 * ```ts
 * @Injectable()
 * export class Cleanup {
 *   @Cron(CronExpression.EVERY_MINUTE)
 *   @Exclusive({ name: 'purge-sessions' })
 *   async purge() { await this.sessions.purgeExpired(); }
 * }
 * ```
 */
export function Exclusive(options: ExclusiveOptions): ExclusiveMethodDecorator {
  const metadata: ExclusiveMetadata = { options };
  return (_target: object, key: string | symbol, descriptor: PropertyDescriptor): void => {
    const original = descriptor.value as unknown;
    if (typeof original !== 'function') {
      throw new LockkitModuleError(
        'OPTIONS_INVALID',
        `@Exclusive() decorates methods only; ${String(key)} is not one.`,
      );
    }
    const method = original as AnyMethod;
    const guarded = async function (this: unknown, ...args: unknown[]): Promise<unknown> {
      const binding = exclusiveBindingOf(this);
      if (!binding) {
        throw new LockkitModuleError(
          'NOT_BOUND',
          `@Exclusive ${options.name} (${String(key)}) was called on an instance LockkitScheduleModule never saw: import the module, and call the method once the application has initialised.`,
        );
      }
      const result = await binding.locks.runExclusiveJob(
        options.namespace ?? binding.namespace,
        options.name,
        () => method.apply(this, args),
        options.statementTimeoutMs === undefined
          ? {}
          : { statementTimeoutMs: options.statementTimeoutMs },
      );
      if (!result.executed) {
        binding.skipped(options.name);
        return undefined;
      }
      return result.result;
    };
    // `@Cron()` above `@Exclusive()` has already written its metadata on the original method.
    for (const metadataKey of Reflect.getOwnMetadataKeys(method)) {
      Reflect.defineMetadata(metadataKey, Reflect.getOwnMetadata(metadataKey, method), guarded);
    }
    Reflect.defineMetadata(EXCLUSIVE_KEY, metadata, guarded);
    Object.defineProperty(guarded, 'name', { value: method.name });
    descriptor.value = guarded as never;
  };
}

/** The `@Exclusive` metadata of a method, if it has any. @internal */
export function exclusiveOf(method: unknown): ExclusiveMetadata | undefined {
  if (typeof method !== 'function') return undefined;
  return Reflect.getMetadata(EXCLUSIVE_KEY, method) as ExclusiveMetadata | undefined;
}
