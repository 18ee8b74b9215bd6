/**
 * Transaction-scoped locks: try or wait, then the task inside the lock's transaction. The result
 * is the truth: `executed: true` only when COMMIT committed; a COMMIT that answered ROLLBACK, or
 * whose answer was lost, rejects with its own typed error.
 *
 * @packageDocumentation
 */
import { abandonableCheckout, abandonableWait, type Checkout } from './abandonable-checkout.js';
import { checkCommittable, commitFailed, commitOutcomeUnknown } from './commit-truth.js';
import { track } from './events.js';
import type { Row, TransactionContext } from './executor.js';
import type { LockKey } from './keys.js';
import {
  abortedError,
  checkKey,
  checkTask,
  classify,
  first,
  inRecovery,
  isSkipMarker,
  isStandbyMarker,
  type LockEngine,
  plan,
  refuseInRecovery,
  runTask,
  SKIPPED,
  tryLockOpening,
} from './lock-engine.js';
import type { JobResult, TransactionLockOptions, TransactionTask } from './lock-types.js';
import { waitForLock } from './lock-wait.js';
import { inlinePrepareStatement, oneTripTryLockStatement, type SettingValue } from './sql/locks.js';

/**
 * `withLock` (and `runExclusiveJob`) of one lock client: the task in one transaction holding the
 * key, its result reported only once COMMIT committed.
 */
export async function transactionLock<Tx, Session, T>(
  engine: LockEngine<Tx, Session>,
  key: LockKey,
  task: TransactionTask<Tx, T>,
  callOptions: TransactionLockOptions = {},
): Promise<JobResult<T>> {
  checkKey(key);
  checkTask(task);
  const p = plan({ ...engine.defaults, ...callOptions }, true);
  if (p.signal?.aborted) throw abortedError(p.signal);
  // Once per client, before the first lock is trusted: is this server's lock real?
  if (!engine.trust.trusted) {
    // The self-test may wait for pooled connections: the caller can leave that wait too.
    await abandonableWait(p.signal, engine.trust.ensure(), abortedError);
    if (p.signal?.aborted) throw abortedError(p.signal);
  }
  let connection: TransactionContext<Tx> | undefined;

  const settings: SettingValue[] = [...p.settings];
  if (p.wait && p.timeoutMs !== undefined) settings.unshift(['lock_timeout', p.timeoutMs]);
  // Waiting: first statement sets the timeouts and reports the pid; try: it takes the lock.
  const oneTrip = engine.oneTripSkips && !p.wait;
  const opening = p.wait
    ? inlinePrepareStatement(settings)
    : oneTrip
      ? oneTripTryLockStatement(key, p.mode, settings)
      : tryLockOpening(key, p.mode, settings);

  const tracker = track(engine.emit, key, 'transaction', p.mode, p.wait);
  // Cancels of this call's wait, sent on other connections: the call settles after them.
  const cancels: Promise<void>[] = [];
  // Set once the task has succeeded: what fails after it is the COMMIT.
  let committing = false;
  let checkout: Checkout | undefined;
  const body = async (ctx: TransactionContext<Tx>, openingRows: Row[]): Promise<JobResult<T>> => {
    // The caller left while this call waited for its connection: roll back, give it back.
    if (checkout?.enter() === false) throw abortedError(p.signal as AbortSignal);
    connection = ctx;
    if (p.wait) {
      await waitForLock(
        engine,
        ctx,
        key,
        p,
        first(openingRows).pid as number,
        'transaction',
        cancels,
      );
      // Got it, but the caller gave up meanwhile: the rollback releases it.
      if (p.signal?.aborted) throw abortedError(p.signal);
    } else {
      const row = first(openingRows);
      // Before `acquired`: on a standby nothing was taken, and nothing may run.
      refuseInRecovery(row, `lock ${key}`);
      if (row.acquired !== true) {
        tracker.skipped();
        return SKIPPED;
      }
      // Got it, but the caller gave up while the call waited for its connection: the task does
      // not start, and the rollback releases the lock.
      if (p.signal?.aborted) throw abortedError(p.signal);
    }
    tracker.acquired();
    const result = await runTask(task, ctx.tx, key, ctx.query, ctx, p.signal);
    // Make sure COMMIT will commit the transaction that took the lock: the task has not ended it
    // itself, and (where the executor cannot read COMMIT's answer) it is not aborted. Tested here
    // first: no extra await on the hot path of executors that can tell both.
    if (
      !engine.executor.commitReportsRollback ||
      (ctx.ended !== undefined && ctx.ended() !== false)
    ) {
      await checkCommittable(engine.executor, ctx, `lock ${key}`, first(openingRows).began);
    }
    // A connection already lost cannot be committing: that is a rollback, not an unknown.
    committing = !(ctx.lost ?? ctx.signal.aborted);
    return { executed: true, result };
  };

  try {
    const result = await abandonableCheckout(
      p.signal,
      (c) => {
        checkout = c;
        // Checked before the opening: an abandoned call sends nothing (the opening may take the
        // lock). `body` checks again, for executors that do not call `beforeSend`.
        const enter = (): void => {
          if (!c.enter()) throw abortedError(p.signal as AbortSignal);
        };
        const executor = engine.executor;
        if (oneTrip && executor.firstThenBegin) {
          return executor.firstThenBegin(opening, body, enter);
        }
        if (executor.pipelinedTransaction) {
          return executor.pipelinedTransaction(opening, body, enter);
        }
        return executor.transaction(async (ctx) => {
          enter();
          return body(ctx, await ctx.query(opening));
        });
      },
      abortedError,
    );
    if (result.executed) tracker.settled(undefined);
    return result;
  } catch (error) {
    if (oneTrip && connection === undefined && isSkipMarker(error)) {
      tracker.skipped();
      return SKIPPED;
    }
    const classified =
      (oneTrip &&
        connection === undefined &&
        isStandbyMarker(error) &&
        inRecovery(`lock ${key}`, error)) ||
      (committing &&
        (commitOutcomeUnknown(error, connection?.signal.aborted === true, `lock ${key}`) ??
          commitFailed(error, `lock ${key}`))) ||
      classify(error, `lock ${key}`, connection, p.signal);
    tracker.settled(classified);
    throw classified;
  } finally {
    if (cancels.length > 0) await Promise.all(cancels);
  }
}
