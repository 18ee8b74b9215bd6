/**
 * The one place where Postgres SQLSTATEs become typed lockkit errors.
 *
 * Drivers differ in how they surface a server error, but node-postgres, postgres.js and Prisma's
 * pg adapter all keep the SQLSTATE in a `code` string (Prisma: on `cause` or `meta`).
 */
import {
  ConnectionLostError,
  DeadlockError,
  LockkitError,
  LockTableFullError,
  LockTimeoutError,
  NotPrimaryError,
} from './errors.js';

/** Five characters of digits and capitals; Prisma's own codes (P1000…P6999) look alike but are not. */
const isSqlState = (code: unknown): code is string =>
  typeof code === 'string' && /^[0-9A-Z]{5}$/.test(code) && !/^P[1-9]/.test(code);

/**
 * SQLSTATE of a driver error, looked up on the error and what it wraps: `cause` chains, Prisma's
 * `meta.code` and `meta.driverAdapterError`, a Prisma driver adapter's `originalCode`.
 */
export function sqlState(error: unknown): string | undefined {
  const queue: unknown[] = [error];
  for (let seen = 0; queue.length > 0 && seen < 8; seen++) {
    const current = queue.shift();
    if (typeof current !== 'object' || current === null) continue;
    const { code, meta, cause, originalCode } = current as {
      code?: unknown;
      meta?: { code?: unknown; driverAdapterError?: unknown };
      cause?: unknown;
      originalCode?: unknown;
    };
    if (isSqlState(code)) return code;
    if (isSqlState(meta?.code)) return meta.code;
    // A Prisma driver adapter's error (`DriverAdapterError`) keeps Postgres's SQLSTATE here.
    if (isSqlState(originalCode)) return originalCode;
    queue.push(cause, meta?.driverAdapterError);
  }
  return undefined;
}

/**
 * Maps a driver error to the typed lockkit error for its SQLSTATE, or returns it unchanged when
 * it is not one lockkit gives a meaning to. `what` names the operation for the message.
 */
export function fromPostgresError(error: unknown, what: string): unknown {
  if (error instanceof LockkitError) return error;
  const state = sqlState(error);
  const detail = error instanceof Error ? error.message : String(error);
  switch (state) {
    case '55P03':
      return new LockTimeoutError(`${what}: lock not acquired within the timeout (${detail}).`, {
        cause: error,
      });
    case '40P01':
      return new DeadlockError(`${what}: rolled back to break a deadlock (${detail}).`, {
        cause: error,
      });
    case '25P03':
      return new ConnectionLostError(
        `${what}: the server closed the connection after idle_in_transaction_session_timeout; its locks are released (${detail}).`,
        { cause: error, idleInTransactionTimeout: true },
      );
    case '57P01':
    case '57P02':
    case '57P03':
      return new ConnectionLostError(
        `${what}: the server terminated the connection; its locks are released (${detail}).`,
        { cause: error },
      );
    case '53200':
      return new LockTableFullError(
        `${what}: the Postgres lock table is full (out of shared memory). Release locks sooner or raise max_locks_per_transaction (needs a restart) (${detail}).`,
        { cause: error },
      );
    case '25006':
      return new NotPrimaryError(
        `${what}: the server refused a write as read-only, so nothing was recorded: it is a hot standby (a replica or reader endpoint), or the transaction or database is set read-only. Point lockkit at the primary (${detail}).`,
        'read-only',
        { cause: error },
      );
    case '57014':
      return new LockkitError(
        'STATEMENT_TIMEOUT',
        `${what}: statement cancelled by statement_timeout or a cancel request (${detail}).`,
        { cause: error },
      );
    default:
      return error;
  }
}
