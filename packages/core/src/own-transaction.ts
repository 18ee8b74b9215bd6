/**
 * lockkit's own short transactions — a migration, the scheduler's ledger reads and records outside
 * a lock — run straight on the executor, with their failures typed as the lock paths type theirs:
 * a lost connection is {@link ConnectionLostError} (the transaction rolled back), a connection lost
 * once the body was done and only COMMIT was left is {@link CommitOutcomeUnknownError}, and a
 * Postgres error keeps the meaning `fromPostgresError` gives it. A driver's raw "Connection
 * terminated unexpectedly" never reaches the caller, nor a pool's refusal to lend a connection in
 * time (`POOL_TIMEOUT`: nothing ran).
 *
 * @packageDocumentation
 */
import { commitFailed, commitOutcomeUnknown } from './commit-truth.js';
import { isConnectionLoss } from './connection-loss.js';
import { ConnectionLostError, LockkitError } from './errors.js';
import type { LockExecutor, QueryFn } from './executor.js';
import { poolTimeoutError } from './pool-timeout.js';
import { fromPostgresError } from './postgres-errors.js';

/**
 * Runs `body` in one transaction of `executor` and returns what it returns. Rejects with a
 * {@link LockkitError} for a lost connection (`CONNECTION_LOST` before COMMIT,
 * `COMMIT_OUTCOME_UNKNOWN` at it) and for the Postgres errors lockkit maps; any other error of the
 * body's statements passes as `fromPostgresError` leaves it. `what` names the operation in messages.
 *
 * @example
 * ```ts
 * const due = await ownTransaction(executor, 'scheduler ledger', (query) => query(text, params));
 * ```
 */
export async function ownTransaction<T>(
  executor: Pick<LockExecutor<unknown, unknown>, 'transaction'>,
  what: string,
  body: (query: QueryFn) => Promise<T>,
): Promise<T> {
  // Set once the body is done: a failure after that came with COMMIT (or the connection's return).
  let done = false;
  // Set once the executor lent a connection: a failure before it means the call did not run.
  let lent = false;
  try {
    return await executor.transaction(async ({ query }) => {
      lent = true;
      const result = await body(query);
      done = true;
      return result;
    });
  } catch (error) {
    throw (!lent && poolTimeoutError(error, what)) || typedFailure(error, what, done);
  }
}

/** The typed error for a failure of lockkit's own transaction (see {@link ownTransaction}). */
function typedFailure(error: unknown, what: string, committing: boolean): unknown {
  if (error instanceof LockkitError) return error;
  if (committing)
    return (
      commitOutcomeUnknown(error, false, what) ??
      commitFailed(error, what) ??
      fromPostgresError(error, what)
    );
  if (isConnectionLoss(error)) {
    const mapped = fromPostgresError(error, what);
    if (mapped instanceof ConnectionLostError) return mapped;
    return new ConnectionLostError(
      `${what}: the connection was lost before the transaction ended; it rolled back, and nothing it wrote was kept.`,
      { cause: error },
    );
  }
  return fromPostgresError(error, what);
}
