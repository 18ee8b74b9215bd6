/**
 * SQL identifiers lockkit builds statements with: validated, then always double-quoted.
 */
import { LockkitError } from '../errors.js';

/** A schema name: letters, digits and underscores, not starting with a digit, at most 63 bytes. */
const IDENTIFIER = /^[A-Za-z_][A-Za-z0-9_]{0,62}$/;

/**
 * Returns `name` double-quoted for use in SQL after checking it is a plain identifier.
 * @throws {@link LockkitError} `OPTION_INVALID` for anything else.
 */
export function quoteIdentifier(name: unknown, what = 'schema'): string {
  if (typeof name !== 'string' || !IDENTIFIER.test(name)) {
    throw new LockkitError(
      'OPTION_INVALID',
      `${what} must be 1–63 letters, digits or underscores, not starting with a digit; got ${JSON.stringify(name)}.`,
    );
  }
  return `"${name}"`;
}
