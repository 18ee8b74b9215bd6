/**
 * Which names lockkit can store: the ledger keeps each scheduler job's name, and the leases table
 * each lease's namespace, job key and owner, in `text` columns — and PostgreSQL text cannot hold
 * U+0000.
 *
 * @packageDocumentation
 */
import { LockKeyError } from './errors.js';
import { LockKey } from './keys.js';

/**
 * Whether a `text` column stores `value` as it is: it holds no NUL (U+0000), which PostgreSQL
 * refuses (SQLSTATE 22021), and no lone UTF-16 surrogate, which the driver's UTF-8 encoding
 * turns into U+FFFD — stored, but no longer the string it was given.
 */
export function isStorableText(value: string): boolean {
  return !value.includes('\u0000') && value.isWellFormed();
}

/** Refuses a name with NUL, which a lock key alone could hash but a `text` column cannot store. */
function refuseNul(name: string, what: string): void {
  if (name.includes('\u0000')) {
    throw new LockKeyError(
      'KEY_MALFORMED',
      `${what} ${JSON.stringify(name)} contains NUL (U+0000), which PostgreSQL text cannot store.`,
    );
  }
}

/**
 * The lock key of a scheduler job, after checking that its name can be stored in the ledger.
 * @throws {@link LockKeyError} `KEY_MALFORMED` for a NUL character or a lone UTF-16 surrogate,
 * `KEY_TOO_LONG` above {@link MAX_KEY_NAME_BYTES} UTF-8 bytes, `KEY_EMPTY`, `KEY_NOT_STRING`.
 */
export function jobKey(namespace: string, name: string): LockKey {
  const key = LockKey.fromNames(namespace, name); // type, emptiness, surrogates, length
  refuseNul(name, 'job name');
  return key;
}

/**
 * The lock key of a lease, after checking that its namespace and job key can be stored in the
 * leases table: what `runWithLease` and `withFencedWrite` check before any SQL. (A plain lock's
 * names are only hashed, never sent, so {@link LockKey.fromNames} accepts NUL.)
 * @throws {@link LockKeyError} `KEY_MALFORMED` for a NUL character or a lone UTF-16 surrogate in
 * either name, `KEY_TOO_LONG` above {@link MAX_KEY_NAME_BYTES} UTF-8 bytes, `KEY_EMPTY`,
 * `KEY_NOT_STRING`.
 */
export function leaseKey(namespace: string, jobKey: string): LockKey {
  const key = LockKey.fromNames(namespace, jobKey); // type, emptiness, surrogates, length
  refuseNul(namespace, 'namespace');
  refuseNul(jobKey, 'jobKey');
  return key;
}
