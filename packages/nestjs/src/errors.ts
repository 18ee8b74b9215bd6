/**
 * The one error this package adds to lockkit's: bad module input found while the Nest
 * application initialises, never at a job's first tick.
 *
 * @packageDocumentation
 */
import { LockkitError, type LockkitErrorOptions } from '@lockkit/core';

/** What exactly {@link LockkitModuleError} found wrong. */
export type LockkitModuleErrorReason =
  /** Two methods declare one job or lock name. */
  | 'DUPLICATE_NAME'
  /** The scheduler refused a job: invalid cron expression, time zone or option. */
  | 'INVALID_JOB'
  /** A decorated method lives in a request- or transient-scoped provider, which has no single instance to run. */
  | 'NOT_STATIC'
  /** An `@Exclusive` method was called on an instance the module never saw (the module is not imported, or the method was called before the application initialised). */
  | 'NOT_BOUND'
  /** `exclusiveSignal()` was called outside a method guarded by `@Exclusive`. */
  | 'OUTSIDE_EXCLUSIVE'
  /** The module's options are not usable (no lock client, a bad logger, …). */
  | 'OPTIONS_INVALID'
  /** `LockkitScheduleModule` is imported more than once in one application: each copy would run every job. */
  | 'DUPLICATE_MODULE';

/**
 * Thrown by `@lockkit/nestjs` during the application's initialisation for bad input, so that a
 * misconfigured replica fails to start instead of failing quietly at its first tick (and, for a
 * decorator on something that is not an instance method, when the class is defined; for a
 * guarded method called outside the module's reach, at the call: `NOT_BOUND`,
 * `OUTSIDE_EXCLUSIVE`). Its `code` is
 * always `OPTION_INVALID` (so `isLockkitError(e) && e.code === 'OPTION_INVALID'` catches it with
 * core's errors); `reason` says which check failed, and `cause` keeps core's own error.
 *
 * @example
 * ```ts
 * try { await app.init(); }
 * catch (e) { if (e instanceof LockkitModuleError && e.reason === 'DUPLICATE_NAME') … }
 * ```
 */
export class LockkitModuleError extends LockkitError {
  /** Which check failed. */
  readonly reason: LockkitModuleErrorReason;

  /** @param reason which check failed; @param message what and where (class and method). */
  constructor(
    reason: LockkitModuleErrorReason,
    message: string,
    options: LockkitErrorOptions = {},
  ) {
    super('OPTION_INVALID', message, options);
    this.name = 'LockkitModuleError';
    this.reason = reason;
  }
}
