/**
 * The one place that decides whether a driver error means "the connection itself is gone", as
 * opposed to "one statement failed". Every adapter and core's engine use it.
 *
 * @packageDocumentation
 */
import { isLockkitError } from './errors.js';
import { TaskFailure } from './lock-engine.js';
import { sqlState } from './postgres-errors.js';

/**
 * What `error` wraps: a task's own error (a task that hit the dead connection itself), else its
 * `cause`.
 */
function wrapped(error: object): unknown {
  return error instanceof TaskFailure ? error.error : (error as { cause?: unknown }).cause;
}

/**
 * SQLSTATEs and driver codes of a lost connection: the admin-shutdown class (57P01-57P03), the
 * connection-exception class (08xxx), the Node socket errors of a connection that broke, timed out
 * or never came (ECONNRESET, EPIPE, ETIMEDOUT, ECONNREFUSED, unreachable hosts and networks, DNS —
 * named one by one: an ENOENT or EACCES a task throws is its own failure, not a dead connection),
 * postgres.js's `CONNECTION_*` codes, and Prisma's P1001 (server unreachable) and P1017 (server
 * closed the connection).
 */
const LOST_CODES =
  /^(57P0[123]|08[0-9A-Z]{3}|E(CONNRESET|CONNREFUSED|CONNABORTED|PIPE|TIMEDOUT|HOSTUNREACH|HOSTDOWN|NETUNREACH|NETDOWN|NETRESET|NOTCONN|ADDRNOTAVAIL|AI_AGAIN|NOTFOUND)|CONNECTION_[A-Z_]+|P1001|P1017)$/;

/** Driver messages that carry no code (node-postgres raises plain Errors for a dead socket). */
const LOST_MESSAGES =
  /Connection terminated|not queryable|connection error|Client was closed|Server has closed the connection/i;

/** The codes an error and what it wraps carry: its own `code`, `meta.code`, the `cause` chain. */
function codesOf(error: unknown): string[] {
  const codes: string[] = [];
  let current: unknown = error;
  for (let depth = 0; depth < 4 && typeof current === 'object' && current !== null; depth++) {
    const state = sqlState(current);
    if (state !== undefined) codes.push(state);
    const { code, meta } = current as { code?: unknown; meta?: { code?: unknown } };
    if (typeof code === 'string') codes.push(code);
    if (typeof meta?.code === 'string') codes.push(meta.code);
    current = wrapped(current);
  }
  return codes;
}

/**
 * True when `error` means the connection is unusable (its server is gone, its socket broke), not
 * that one statement failed.
 */
export function isConnectionLoss(error: unknown): boolean {
  if (typeof error !== 'object' || error === null) return false;
  if (codesOf(error).some((code) => LOST_CODES.test(code))) return true;
  let current: unknown = error;
  for (let depth = 0; depth < 4 && typeof current === 'object' && current !== null; depth++) {
    const { message } = current as { message?: unknown };
    if (typeof message === 'string' && LOST_MESSAGES.test(message)) return true;
    current = wrapped(current);
  }
  return false;
}

/**
 * True when `error` means the database went away under a call whose outcome the caller cannot
 * take as a plain failure: the connection is lost ({@link isConnectionLoss}, or core's
 * `CONNECTION_LOST`), or a COMMIT's answer never came (`COMMIT_OUTCOME_UNKNOWN`). Such a call may
 * be asked about, or run, again on a new connection.
 */
export function isLostOrOutcomeUnknown(error: unknown): boolean {
  if (isLockkitError(error))
    return error.code === 'CONNECTION_LOST' || error.code === 'COMMIT_OUTCOME_UNKNOWN';
  return isConnectionLoss(error);
}
