/**
 * Typed errors of lockkit.
 *
 * Every error lockkit raises is a {@link LockkitError} with a machine-readable {@link LockkitErrorCode}.
 * Subclasses exist only where a caller is expected to branch on them. The original error (a driver
 * error, a Postgres error) is kept as the ES2022 `cause`, and the stack is never blanked.
 *
 * @packageDocumentation
 */

/** Codes carried by a {@link LockKeyError}: what exactly is wrong with a lock key input. */
export type LockKeyErrorCode =
  | 'KEY_NOT_STRING'
  | 'KEY_EMPTY'
  | 'KEY_MALFORMED'
  | 'KEY_TOO_LONG'
  | 'KEY_NOT_INTEGER'
  | 'KEY_OUT_OF_RANGE'
  | 'KEY_NOT_ADVISORY';

/** Every code a {@link LockkitError} can carry. */
export type LockkitErrorCode = LockKeyErrorCode | 'CAPABILITY_UNSUPPORTED' | 'EXECUTOR_INVALID';

/** The brand that {@link isLockkitError} checks; `Symbol.for` so it is shared by every copy of the package. */
const LOCKKIT_ERROR_BRAND: unique symbol = Symbol.for('lockkit.error') as never;

/** Options accepted by every lockkit error constructor. */
export interface LockkitErrorOptions {
  /** The underlying error, kept as the standard ES2022 `cause`. */
  readonly cause?: unknown;
}

/**
 * Base class of every error lockkit throws.
 *
 * Prefer {@link isLockkitError} over `instanceof`: two copies of `@lockkit/core` in one
 * `node_modules` have two different classes, but share the brand.
 *
 * @example
 * ```ts
 * try { await locks.runExclusiveJob('billing', 'nightly', task); }
 * catch (err) { if (isLockkitError(err) && err.code === 'LOCK_TIMEOUT') retryLater(); else throw err; }
 * ```
 */
export class LockkitError extends Error {
  /** What went wrong, stable across versions. */
  readonly code: LockkitErrorCode;
  /** @internal brand checked by {@link isLockkitError} */
  readonly [LOCKKIT_ERROR_BRAND] = true;

  constructor(code: LockkitErrorCode, message: string, options: LockkitErrorOptions = {}) {
    super(message, 'cause' in options ? { cause: options.cause } : undefined);
    this.name = 'LockkitError';
    this.code = code;
  }
}

/**
 * Thrown before any SQL is sent when a lock key input is not usable: a name that is not a
 * non-empty string within {@link MAX_KEY_NAME_BYTES}, a number that is not an int32, a bigint
 * outside int64, or a `pg_locks` row that is not an advisory lock.
 */
export class LockKeyError extends LockkitError {
  declare readonly code: LockKeyErrorCode;

  constructor(code: LockKeyErrorCode, message: string, options: LockkitErrorOptions = {}) {
    super(code, message, options);
    this.name = 'LockKeyError';
  }
}

/**
 * Thrown before any SQL is sent when an operation needs an executor capability (a dedicated
 * session, a pipelined BEGIN) that the adapter in use does not provide. The message names the adapter.
 */
export class UnsupportedCapabilityError extends LockkitError {
  /** The adapter's name, as it reports it in `LockExecutor.name`. */
  readonly adapter: string;
  /** The missing capability. */
  readonly capability: string;

  constructor(adapter: string, capability: string, hint?: string) {
    super(
      'CAPABILITY_UNSUPPORTED',
      `The ${adapter} adapter does not support ${capability}.${hint ? ` ${hint}` : ''}`,
    );
    this.name = 'UnsupportedCapabilityError';
    this.adapter = adapter;
    this.capability = capability;
  }
}

/**
 * True for any error thrown by any copy of lockkit, checked by a `Symbol.for` brand rather than
 * by class identity.
 */
export function isLockkitError(value: unknown): value is LockkitError {
  return (
    typeof value === 'object' &&
    value !== null &&
    (value as { [LOCKKIT_ERROR_BRAND]?: unknown })[LOCKKIT_ERROR_BRAND] === true
  );
}
