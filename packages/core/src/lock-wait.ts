/**
 * Waiting for a lock, and giving up on a wait: the caller's signal cancels it with the
 * connection's own protocol cancel where the executor has one, else from another connection,
 * only while that backend still waits for that very lock.
 *
 * @packageDocumentation
 */
import { whenAborted } from './abort-listeners.js';
import type { QueryFn } from './executor.js';
import type { LockKey } from './keys.js';
import { first, type LockEngine, type Plan, refuseInRecovery } from './lock-engine.js';
import { cancelWaitStatement, lockStatement } from './sql/locks.js';

/**
 * Cancels a lock wait from another connection; best effort, the wait may have ended. Settles,
 * never rejects, once the cancel's own transaction is over: the caller awaits it after its own
 * transaction (never inside it — with a pool of one, the cancel needs that very connection).
 */
export function cancelWait<Tx, Session>(
  engine: LockEngine<Tx, Session>,
  pid: number,
  key: LockKey,
): Promise<void> {
  const statement = cancelWaitStatement(pid, key);
  return engine.executor
    .transaction((ctx) => ctx.query(statement.text, statement.params))
    .then(
      () => undefined,
      () => undefined,
    );
}

/**
 * Waits on `query` for the lock, cancelling the wait when `signal` aborts. On a server in recovery
 * nothing is taken or awaited: throws `NotPrimaryError` (the caller rolls back).
 */
export async function waitForLock<Tx, Session>(
  engine: LockEngine<Tx, Session>,
  ctx: { readonly query: QueryFn; readonly interrupt?: (() => Promise<void>) | undefined },
  key: LockKey,
  p: Plan,
  pid: number | undefined,
  scope: 'transaction' | 'session',
  cancels: Promise<void>[],
): Promise<void> {
  const statement = lockStatement(key, scope, p.mode, true);
  let interrupting: Promise<void> | undefined;
  const onAbort = () => {
    // The protocol's own cancel needs no second connection (a pool of one, one client);
    // otherwise cancel from another connection, only while that backend still waits.
    if (ctx.interrupt) interrupting = ctx.interrupt().catch(() => undefined);
    else if (pid !== undefined) cancels.push(cancelWait(engine, pid, key));
  };
  const forget = p.signal ? whenAborted(p.signal, onAbort) : undefined;
  try {
    refuseInRecovery(first(await ctx.query(statement.text, statement.params)), `lock ${key}`);
  } finally {
    forget?.();
    // A protocol cancel names the connection, not the statement: let it land (on this wait,
    // or ignored by an idle backend) before the connection does anything else.
    if (interrupting) await interrupting;
  }
}
