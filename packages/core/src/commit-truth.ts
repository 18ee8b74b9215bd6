/**
 * Telling what COMMIT really did. A transaction a failed statement aborted answers COMMIT with
 * ROLLBACK (no error); a connection lost while COMMIT was in flight leaves the outcome unknown.
 * Every path that reports a task's transaction as done (locks, fenced writes) asks here.
 *
 * @packageDocumentation
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { isConnectionLoss } from './connection-loss.js';
import {
  CommitOutcomeUnknownError,
  CommitRolledBackError,
  LockkitError,
  LockNotHeldError,
} from './errors.js';
import type { LockExecutor, TransactionContext } from './executor.js';
import { sqlState } from './postgres-errors.js';
import { TRANSACTION_STARTED_STATEMENT, TRANSACTION_STATUS } from './sql/locks.js';

/**
 * Just before COMMIT: rejects with {@link LockNotHeldError} when the task ended lockkit's
 * transaction itself (its COMMIT or ROLLBACK released the transaction-scoped lock there and then),
 * and with {@link CommitRolledBackError} when the transaction is aborted (COMMIT would only roll
 * back). Free when the driver can tell both (`ctx.ended` false, `commitReportsRollback`);
 * otherwise one short statement, compared with `began` (the opening's {@link
 * TRANSACTION_STARTED} column) when there is one.
 */
export async function checkCommittable(
  executor: Pick<LockExecutor, 'commitReportsRollback'>,
  ctx: Pick<TransactionContext<unknown>, 'query' | 'ended'>,
  what: string,
  began?: unknown,
): Promise<void> {
  const ended = ctx.ended?.();
  if (ended === true) throw taskEndedTransaction(what);
  if (executor.commitReportsRollback && (ctx.ended === undefined || ended === false)) return;
  let now: unknown;
  try {
    now = (await ctx.query(TRANSACTION_STARTED_STATEMENT))[0]?.began;
  } catch (error) {
    if (sqlState(error) === '25P02') throw commitRolledBack(what, error);
    throw error;
  }
  if (typeof began === 'string' && now !== began) throw taskEndedTransaction(what);
}

/** The error for a task that ended lockkit's transaction itself. */
export function taskEndedTransaction(what: string): LockNotHeldError {
  return new LockNotHeldError(
    `${what}: the task ended lockkit's transaction itself (a COMMIT, ROLLBACK or COMMIT AND CHAIN of its own), and the transaction-scoped lock was released right then: another holder may have run alongside the rest of the task. What the task wrote before that statement may be committed; what came after it was rolled back. Leave BEGIN/COMMIT to lockkit (use savepoints inside a task).`,
  );
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

/** Pauses while a transaction whose COMMIT answer was lost is still open on the server: from, doubling up to. */
const STATUS_POLL_MS = [20, 200] as const;

/**
 * How the transaction `xid` (the `xid` column a fenced write's fence returns) ended, asked on a new connection
 * once its COMMIT's answer was lost: `'committed'` or `'aborted'` as soon as the server knows
 * (a backend whose client vanished mid-transaction aborts once it notices), undefined when it
 * cannot be told — the server does not know the id (a standby promoted before the transaction
 * reached it), the question itself failed, or the transaction is still open after `waitMs`. The
 * caller then keeps its COMMIT_OUTCOME_UNKNOWN.
 */
export async function askCommitStatus(
  executor: Pick<LockExecutor, 'transaction'>,
  xid: string,
  waitMs: number,
): Promise<'committed' | 'aborted' | undefined> {
  const until = performance.now() + waitMs;
  let pauseMs: number = STATUS_POLL_MS[0];
  for (;;) {
    let status: unknown;
    try {
      const [row] = await executor.transaction(({ query }) => query(TRANSACTION_STATUS, [xid]));
      status = row?.status;
    } catch {
      return undefined;
    }
    if (status === 'committed' || status === 'aborted') return status;
    if (status !== 'in progress' || performance.now() + pauseMs > until) return undefined;
    await sleep(pauseMs);
    pauseMs = Math.min(pauseMs * 2, STATUS_POLL_MS[1]);
  }
}
