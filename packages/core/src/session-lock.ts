/**
 * Session-scoped locks on a dedicated connection: refused behind a transaction pooler, released
 * only on the backend that took them, and the connection returned clean — no transaction left
 * open, no hold of the key left — and then, once a task ran on it, closed or reset in full
 * (`SessionContext.discard`): nothing the task did to its session reaches the next pool user.
 *
 * @packageDocumentation
 */
import { abandonableCheckout, abandonableWait } from './abandonable-checkout.js';
import { LockNotHeldError, UnsafeBehindPoolerError } from './errors.js';
import { track } from './events.js';
import { type Row, requireCapability, type SessionContext } from './executor.js';
import type { LockKey } from './keys.js';
import {
  abortedError,
  checkKey,
  checkTask,
  classify,
  first,
  type LockEngine,
  plan,
  refuseInRecovery,
  runTask,
  SKIPPED,
  type TaskFailure,
} from './lock-engine.js';
import type { JobResult, SessionLockOptions, SessionTask } from './lock-types.js';
import { waitForLock } from './lock-wait.js';
import { sqlState } from './postgres-errors.js';
import {
  BEGIN,
  COMMIT,
  guardedSessionLockStatement,
  heldStatement,
  inlinePrepareStatement,
  type LockMode,
  lockStatement,
  NO_STATEMENT_TIMEOUT,
  ROLLBACK,
  type SettingValue,
  sessionReleaseStatement,
  TRANSACTION_PROBE_READ,
  TRANSACTION_PROBE_SET,
  unlockStatement,
} from './sql/locks.js';

/** The refusal of session scope behind a transaction pooler. */
function poolerError(
  engine: LockEngine<unknown, unknown>,
  how: 'declared' | 'detected',
  detail: string,
): UnsafeBehindPoolerError {
  return new UnsafeBehindPoolerError(
    `Session scope is refused on the ${engine.executor.name} executor: ${detail} Behind a transaction pooler a session lock stays on a server connection that the next, unrelated client inherits. Use withLock/runExclusiveJob (transaction scope) or a lease.`,
    how,
  );
}

/**
 * `withSessionLock` of one lock client: the key held at session level on a dedicated connection
 * while the task runs, and the connection handed back clean.
 */
export async function sessionLock<Tx, Session, T>(
  engine: LockEngine<Tx, Session>,
  key: LockKey,
  task: SessionTask<Session, T>,
  callOptions: SessionLockOptions = {},
): Promise<JobResult<T>> {
  checkKey(key);
  checkTask(task);
  requireCapability(
    engine.executor,
    'session',
    'Use a transaction-scoped lock, or a lease for long jobs.',
  );
  if (engine.executor.transactionPooler) {
    throw poolerError(engine, 'declared', 'it was declared to go through a transaction pooler.');
  }
  if (engine.poolerDetected) {
    throw poolerError(engine, 'detected', 'a transaction pooler was detected on an earlier call.');
  }
  const p = plan(callOptions, false);
  if (p.signal?.aborted) throw abortedError(p.signal);
  // Once per client, before the first lock is trusted: is this server's lock real?
  if (!engine.trust.trusted) {
    // The self-test may wait for pooled connections: the caller can leave that wait too.
    await abandonableWait(p.signal, engine.trust.ensure(), abortedError);
    if (p.signal?.aborted) throw abortedError(p.signal);
  }
  let connection: SessionContext<Session> | undefined;
  const tracker = track(engine.emit, key, 'session', p.mode, p.wait);
  const cancels: Promise<void>[] = [];
  const detected = (serverPid: unknown, expectedPid: unknown) => {
    engine.poolerDetected = true;
    return poolerError(
      engine,
      'detected',
      `this connection's statements were expected on backend ${String(expectedPid)}, but the server ran one on backend ${String(serverPid)}: a pooler moved it; no lock was taken.`,
    );
  };
  try {
    const session = engine.executor.session.bind(engine.executor);
    const result = await abandonableCheckout(
      p.signal,
      (checkout) =>
        session(async (ctx): Promise<JobResult<T>> => {
          // The caller left while this call waited for its connection: nothing was sent, give it back.
          if (!checkout.enter()) throw abortedError(p.signal as AbortSignal);
          connection = ctx;
          // The backend every lock statement of this connection must reach: its own on a direct
          // connection or behind a session-mode pooler; behind a transaction pooler, a refusal.
          const pin = await engine.pinning.pin(ctx);
          if ('refused' in pin) {
            engine.poolerDetected = true;
            throw poolerError(engine, 'detected', pin.refused);
          }
          const expectedPid = pin.pid;
          let holderPid: number;
          if (p.wait) {
            // The wait runs in a short transaction only so that SET LOCAL bounds it (and a pooler
            // keeps one server connection for it); the session lock itself survives the COMMIT.
            await ctx.query(BEGIN);
            try {
              const settings: SettingValue[] =
                p.timeoutMs === undefined ? [] : [['lock_timeout', p.timeoutMs]];
              holderPid = first(await ctx.query(inlinePrepareStatement(settings))).pid as number;
              if (expectedPid !== undefined && holderPid !== expectedPid) {
                throw detected(holderPid, expectedPid);
              }
              await waitForLock(engine, ctx, key, p, holderPid, 'session', cancels);
              await ctx.query(COMMIT);
            } catch (error) {
              if (!ctx.signal.aborted) {
                await ctx.query(ROLLBACK).catch(() => {});
                // A wait cut short (timeout, cancel) just as the lock was granted keeps the
                // session lock through the rollback: give it back.
                const held = heldStatement(key, p.mode);
                const rows = await ctx.query(held.text, held.params).catch(() => undefined);
                // Not known: never lend this connection on (it may hold the lock).
                if (rows === undefined) ctx.discard?.();
                else if (Number(first(rows).held) > 0)
                  await release(engine, ctx, key, p.mode, -1, error);
              }
              throw error;
            }
            // Got it, but the caller gave up meanwhile: a session lock outlives the transaction,
            // so it needs its unlock.
            if (p.signal?.aborted) {
              await release(engine, ctx, key, p.mode, holderPid, undefined);
              throw abortedError(p.signal);
            }
          } else {
            const statement =
              expectedPid === undefined
                ? lockStatement(key, 'session', p.mode, false)
                : guardedSessionLockStatement(key, p.mode, false, expectedPid);
            let row: Row;
            try {
              row = first(await ctx.query(statement.text, statement.params));
            } catch (error) {
              // A session lock outlives its statement's error: the server may have taken it before
              // the statement was cancelled (a role's short statement_timeout, a cancel request).
              // Never lend this connection on as it is: closed (or reset), it holds nothing.
              if (!ctx.signal.aborted) ctx.discard?.();
              throw error;
            }
            holderPid = row.pid as number;
            // Before `acquired`: NULL there also means a standby, where nothing was taken.
            refuseInRecovery(row, `session lock ${key}`);
            if (row.acquired === null) throw detected(holderPid, expectedPid);
            if (row.acquired !== true) {
              tracker.skipped();
              return SKIPPED;
            }
            // Got it, but the caller gave up while the call waited for its connection: the task
            // does not start, and the session lock is given back.
            if (p.signal?.aborted) {
              await release(engine, ctx, key, p.mode, holderPid, undefined);
              throw abortedError(p.signal);
            }
          }
          tracker.acquired();
          let outcome: { ok: true; result: T } | { ok: false; failure: TaskFailure };
          try {
            outcome = {
              ok: true,
              result: await runTask(task, ctx.session, key, ctx.query, ctx, p.signal),
            };
          } catch (error) {
            outcome = { ok: false, failure: error as TaskFailure };
          }
          // The connection died during the task: the lock went with it, and the caller must know.
          if (ctx.signal.aborted) throw outcome.ok ? ctx.signal.reason : outcome.failure;
          try {
            await release(
              engine,
              ctx,
              key,
              p.mode,
              holderPid,
              outcome.ok ? undefined : outcome.failure.error,
            );
            // Whatever the task did to its session — a SET (custom settings too, which no catalog
            // lists), a role, another key's lock, LISTEN, temporary objects, a sequence's lastval,
            // prepared statements — the next pool user must not inherit it, and Postgres cannot list
            // all of it: the connection is closed (or reset in full), never lent on as it is.
            ctx.discard?.();
          } catch (error) {
            // Not known clean: never lend this connection to anyone else.
            ctx.discard?.();
            throw error;
          }
          if (!outcome.ok) throw outcome.failure;
          return { executed: true, result: outcome.result };
        }),
      abortedError,
    );
    if (result.executed) tracker.settled(undefined);
    return result;
  } catch (error) {
    const classified = classify(error, `session lock ${key}`, connection, p.signal);
    tracker.settled(classified);
    throw classified;
  } finally {
    if (cancels.length > 0) await Promise.all(cancels);
  }
}

/**
 * How many times a statement of the release is sent while the server cancels it: a timeout the
 * task left cancels only a statement that runs longer than it, and the one lockkit sends to lift
 * it takes microseconds, so a second cancel is rare and a fifth means the server cancels
 * everything; then the call fails and the connection, discarded, takes the lock with it.
 */
const RELEASE_ATTEMPTS = 5;

/**
 * One unlock for the one acquire, sent only to the backend that holds the lock (`holderPid`;
 * -1 when this very connection is known to hold it). A lock that is no longer held is an
 * error, never silence; a statement that reached another backend means a pooler moved us.
 */
async function release(
  engine: LockEngine<unknown, unknown>,
  ctx: Pick<SessionContext<unknown>, 'query' | 'inTransaction'>,
  key: LockKey,
  mode: LockMode,
  holderPid: number,
  taskError: unknown,
): Promise<void> {
  const { query } = ctx;
  const unlock = async () => {
    const pid =
      holderPid === -1
        ? Number(first(await query('SELECT pg_backend_pid() AS pid')).pid)
        : holderPid;
    // After the task: the one unlock for the one acquire, and every further hold of the key
    // the task took itself, so the connection goes back holding nothing of it.
    const statement =
      holderPid === -1 ? unlockStatement(key, mode, pid) : sessionReleaseStatement(key, mode, pid);
    return first(await query(statement.text, statement.params));
  };
  // The task may have left a statement_timeout too short for these statements (on the session, or
  // in the transaction it left open), and the server then cancels one (57014). A cancelled
  // statement did nothing lockkit relies on, bar aborting the transaction it ran in: send it again.
  const uncancelled = async <R>(step: () => Promise<R>): Promise<R> => {
    for (let attempt = 1; ; attempt++) {
      try {
        return await step();
      } catch (error) {
        if (sqlState(error) !== '57014' || attempt >= RELEASE_ATTEMPTS) throw error;
      }
    }
  };
  // A transaction the task left open (or failed) on the session would swallow the next pool
  // user's work: roll it back first.
  let open: boolean;
  if (ctx.inTransaction) open = ctx.inTransaction();
  else {
    try {
      await query(TRANSACTION_PROBE_SET);
      open = first(await query(TRANSACTION_PROBE_READ)).open === true;
    } catch (error) {
      // 25P02: a failed transaction. 57014: the probe was cancelled, which aborts the transaction
      // it ran in, if there was one. Roll back either way: outside a transaction, ROLLBACK only warns.
      const state = sqlState(error);
      if (state !== '25P02' && state !== '57014') throw error;
      open = true;
    }
  }
  if (open) await uncancelled(() => query(ROLLBACK));
  let row: Row;
  try {
    row = await unlock();
  } catch (error) {
    if (sqlState(error) !== '57014') throw error;
    // Outside any transaction now: lift the timeout for the rest of this session (discarded after
    // the task), then unlock again. The lift's own timer may still fire as the lift finishes: the
    // server then cancels the next statement before running it (a loaded server does this), with
    // the timeout already 0 — so the unlock, too, is sent again when cancelled.
    await uncancelled(() => query(NO_STATEMENT_TIMEOUT));
    row = await uncancelled(unlock);
    // An unlock is not undone by the cancel of its statement: the cancelled attempt may have
    // released the lock already, so "not held" here says nothing of anyone else.
    if (row.released === false) return;
  }
  if (row.released === null) {
    engine.poolerDetected = true;
    throw new UnsafeBehindPoolerError(
      `session lock ${key} was taken on backend ${holderPid}, but this connection now reaches backend ${String(row.pid)}: a transaction pooler is in between. The lock stays on backend ${holderPid} until that server connection closes; use transaction scope here.`,
      'detected',
    );
  }
  if (row.released !== true) {
    throw new LockNotHeldError(
      `session lock ${key} was no longer held when released: something unlocked it while the task ran, so other holders may have run concurrently.`,
      taskError === undefined ? {} : { cause: taskError },
    );
  }
}
