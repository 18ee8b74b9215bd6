/**
 * The shape checks `createScheduler` and `register` run before anything else, so that a wrong
 * argument fails at once with a typed {@link LockkitError} (`OPTION_INVALID`), never later as a
 * `TypeError` or as a silently different behaviour.
 *
 * @packageDocumentation
 */
import { LockkitError } from './errors.js';
import { isStorableText } from './job-name.js';

/** `value` is a plain options object (not null, not an array, not a string). */
function isOptionsObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/**
 * Refuses scheduler options that are not an object, a `clock` without `now` and `setTimer`
 * functions, a `now` that is not a function, and an `owner` that is not a non-empty string the
 * ledger can store as given (no NUL, no lone UTF-16 surrogate).
 */
export function checkSchedulerOptions(options: unknown): void {
  if (options === undefined) return;
  if (!isOptionsObject(options))
    throw new LockkitError('OPTION_INVALID', 'scheduler options must be an object.');
  const { clock, now, owner } = options;
  // Stored in every ledger row and lease the scheduler writes: refused here, before any SQL,
  // rather than by PostgreSQL (22021) on every tick.
  if (owner !== undefined && (typeof owner !== 'string' || owner === '' || !isStorableText(owner)))
    throw new LockkitError(
      'OPTION_INVALID',
      'owner must be a non-empty string without NUL (U+0000) or a lone UTF-16 surrogate (PostgreSQL text cannot store it as given).',
    );
  if (
    clock !== undefined &&
    !(
      isOptionsObject(clock) &&
      typeof clock.now === 'function' &&
      typeof clock.setTimer === 'function'
    )
  ) {
    throw new LockkitError(
      'OPTION_INVALID',
      'clock must be an object with now() and setTimer(ms, callback) methods.',
    );
  }
  if (now !== undefined && typeof now !== 'function')
    throw new LockkitError(
      'OPTION_INVALID',
      'now must be a function returning ms since the epoch.',
    );
}

/** Refuses job options that are not an object, and a `lease` that is not one. */
export function checkJobOptions(job: string, options: unknown): void {
  if (!isOptionsObject(options))
    throw new LockkitError('OPTION_INVALID', `job "${job}": options must be an object.`);
  if (options.lease !== undefined && !isOptionsObject(options.lease))
    throw new LockkitError('OPTION_INVALID', `job "${job}": lease must be an object.`);
  if (options.timezone === '')
    throw new LockkitError(
      'OPTION_INVALID',
      `job "${job}": timezone must be an IANA name (omit it for UTC), not ''.`,
    );
}

/**
 * Whether `value` is a valid catch-up policy: `'skip'`, `'latest'`, or an object with a
 * positive integer `withinMs` (ms).
 */
export function isCatchUpPolicy(value: unknown): boolean {
  if (value === 'skip' || value === 'latest') return true;
  if (!isOptionsObject(value)) return false;
  const { withinMs } = value;
  return (
    typeof withinMs === 'number' &&
    Number.isInteger(withinMs) &&
    withinMs >= 1 &&
    withinMs <= 2_147_483_647
  );
}
