/**
 * Telling what COMMIT really did. A transaction a failed statement aborted answers COMMIT with
 * ROLLBACK (no error); a connection lost while COMMIT was in flight leaves the outcome unknown.
 * Every path that reports a task's transaction as done (locks, fenced writes) asks here.
 *
 * @packageDocumentation
 */
import { isConnectionLoss } from './connection-loss.js';
import { CommitOutcomeUnknownError, CommitRolledBackError, LockkitError } from './errors.js';
import type { LockExecutor, QueryFn } from './executor.js';
import { sqlState } from './postgres-errors.js';
import { TRANSACTION_ALIVE } from './sql/locks.js';

/**
 * Just before COMMIT, for executors that cannot read COMMIT's answer: rejects with
 * {@link CommitRolledBackError} when the transaction is aborted (COMMIT would only roll back).
 */
export async function checkCommittable(
  executor: Pick<LockExecutor, 'commitReportsRollback'>,
  query: QueryFn,
  what: string,
): Promise<void> {
  if (executor.commitReportsRollback) return;
  try {
    await query(TRANSACTION_ALIVE);
  } catch (error) {
    if (sqlState(error) === '25P02') throw commitRolledBack(what, error);
    throw error;
  }
}

/** The error for a COMMIT that answered ROLLBACK. */
export function commitRolledBack(what: string, cause: unknown): CommitRolledBackError {
  return new CommitRolledBackError(
    `${what}: the task returned, but its transaction had failed (a statement in it raised an error, perhaps one the task caught), so COMMIT rolled it back: nothing was written.`,
    { cause },
  );
}

/**
 * A failure after the task succeeded and COMMIT was sent on a live connection: when it is the
 * connection's loss, the outcome is unknown ({@link CommitOutcomeUnknownError}); otherwise
 * undefined (the failure is what it says).
 */
export function commitOutcomeUnknown(
  error: unknown,
  connectionLost: boolean,
  what: string,
): CommitOutcomeUnknownError | undefined {
  if (error instanceof LockkitError) return undefined;
  if (!connectionLost && !isConnectionLoss(error)) return undefined;
  return new CommitOutcomeUnknownError(
    `${what}: the connection was lost after COMMIT was sent, before its answer: the transaction may or may not have committed. Check what the task writes before running it again.`,
    { cause: error },
  );
}

/**
 * A failure of COMMIT itself on a live connection — a deferred constraint (23xxx), a
 * serialization failure (40001), any error Postgres raised at COMMIT: the transaction rolled back,
 * nothing was written. Returns {@link CommitRolledBackError} with the driver's error as `cause`
 * (its SQLSTATE readable there); undefined for lockkit's own errors and errors with no SQLSTATE.
 */
export function commitFailed(error: unknown, what: string): CommitRolledBackError | undefined {
  if (error instanceof LockkitError || isConnectionLoss(error)) return undefined;
  const state = sqlState(error);
  if (state === undefined) return undefined;
  return new CommitRolledBackError(
    `${what}: COMMIT failed (SQLSTATE ${state}), so the transaction rolled back: nothing was written. The driver's error is the cause.`,
    { cause: error },
  );
}
