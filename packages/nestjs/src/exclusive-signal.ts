/**
 * `exclusiveSignal()`: how a method guarded by `@Exclusive` learns that its lock can no longer be
 * trusted, or that the application is shutting down.
 *
 * @packageDocumentation
 */
import { AsyncLocalStorage } from 'node:async_hooks';
import { LockkitModuleError } from './errors.js';

// One store per process, even when the ESM and the CommonJS builds of this package are both
// loaded: the decorator of one copy and the function of the other must see the same calls.
const STORE = Symbol.for('lockkit:nestjs:exclusive-signal');
const slot = globalThis as { [STORE]?: AsyncLocalStorage<AbortSignal> };
slot[STORE] ??= new AsyncLocalStorage();
const calls: AsyncLocalStorage<AbortSignal> = slot[STORE];

/**
 * The signal of the `@Exclusive` call this code runs in. It aborts when the connection holding the
 * call's lock errored, ended or was terminated — Postgres has then released the lock, and another
 * replica may already be inside the same method — or when the application starts shutting down.
 * Check it between steps (`signal.throwIfAborted()`), or pass it on to work that takes a signal
 * (`fetch`, a driver's cancellable query). Callable anywhere in the method's asynchronous call
 * tree; outside an `@Exclusive` call it throws a {@link LockkitModuleError} (`OUTSIDE_EXCLUSIVE`).
 *
 * @example
 * ```ts
 * @Cron(CronExpression.EVERY_MINUTE)
 * @Exclusive({ name: 'purge-sessions' })
 * async purge() {
 *   const signal = exclusiveSignal();
 *   for (const batch of await this.sessions.expiredBatches()) {
 *     signal.throwIfAborted(); // the lock is gone: stop before another replica overlaps us
 *     await this.sessions.delete(batch);
 *   }
 * }
 * ```
 */
export function exclusiveSignal(): AbortSignal {
  const signal = calls.getStore();
  if (signal === undefined) {
    throw new LockkitModuleError(
      'OUTSIDE_EXCLUSIVE',
      'exclusiveSignal() was called outside a method guarded by @Exclusive (or outside the asynchronous work it started).',
    );
  }
  return signal;
}

/** Runs `fn` with `signal` as what {@link exclusiveSignal} returns inside it. @internal */
export function withExclusiveSignal<T>(signal: AbortSignal, fn: () => T): T {
  return calls.run(signal, fn);
}
