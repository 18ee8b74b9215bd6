/**
 * Which scheduler job names can be stored: the ledger keeps each name in a `text` column, and
 * PostgreSQL text cannot hold U+0000.
 *
 * @packageDocumentation
 */
import { LockKeyError } from './errors.js';
import { LockKey } from './keys.js';

/**
 * The lock key of a scheduler job, after checking that its name can be stored in the ledger.
 * @throws {@link LockKeyError} `KEY_MALFORMED` for a NUL character or a lone UTF-16 surrogate,
 * `KEY_TOO_LONG` above {@link MAX_KEY_NAME_BYTES} UTF-8 bytes, `KEY_EMPTY`, `KEY_NOT_STRING`.
 */
export function jobKey(namespace: string, name: string): LockKey {
  const key = LockKey.fromNames(namespace, name); // type, emptiness, surrogates, length
  if (name.includes('\u0000')) {
    throw new LockKeyError(
      'KEY_MALFORMED',
      `job name ${JSON.stringify(name)} contains NUL (U+0000), which PostgreSQL text cannot store.`,
    );
  }
  return key;
}
