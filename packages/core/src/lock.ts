/**
 * The lock engine: every lock operation users call, written once over any {@link LockExecutor}.
 *
 * @packageDocumentation
 */
import {
  ConnectionLostError,
  LockkitError,
  LockNotHeldError,
  TransactionExpiredError,
  UnsafeBehindPoolerError,
} from './errors.js';
import { emitter, type LockkitEventListener, track } from './events.js';
import {
  assertLockExecutor,
  type LockExecutor,
  type QueryFn,
  type Row,
  requireCapability,
  type SessionContext,
  type TransactionContext,
} from './executor.js';
import { LockKey } from './keys.js';
import { type LeaseOperations, leaseOperations } from './lease.js';
import { DEFAULT_SCHEMA, type MigrationResult, migrate } from './migrate.js';
import { fromPostgresError, sqlState } from './postgres-errors.js';
import { SessionPinning } from './session-pinning.js';
import { quoteIdentifier } from './sql/identifiers.js';
import {
  BEGIN,
  COMMIT,
  cancelBackendStatement,
  checkMilliseconds,
  guardedSessionLockStatement,
  heldStatement,
  inlinePrepareStatement,
  inlineTryLockStatement,
  type LockMode,
  lockStatement,
  oneTripTryLockStatement,
  ROLLBACK,
  type SettingValue,
  SKIP_MARKER,
  unlockStatement,
} from './sql/locks.js';

/** How to acquire a lock. */
export interface AcquireOptions {
  /** `'exclusive'` (default) or `'shared'`: shared holders coexist, exclusive excludes all. */
  readonly mode?: LockMode;
  /**
   * `false` (default): try once and return `{ executed: false }` at once when the lock is taken.
   * `true`: wait for it (bounded by `timeoutMs`, cancelled by `signal`).
   */
  readonly wait?: boolean;
  /** With `wait: true`: give up after this many milliseconds with a `LockTimeoutError`. */
  readonly timeoutMs?: number;
  /**
   * Cancels a wait (the operation then rejects with code `ABORTED`) and is combined into the
   * task's own signal.
   */
  readonly signal?: AbortSignal;
}

/** Options of a transaction-scoped lock. */
export interface TransactionLockOptions extends AcquireOptions {
  /** `SET LOCAL statement_timeout` for the transaction: no single statement runs longer. */
  readonly statementTimeoutMs?: number;
  /**
   * `SET LOCAL idle_in_transaction_session_timeout`: if the task stops talking to the database
   * for this long, Postgres ends the connection and the lock is released, so a stuck task cannot
   * pin a lock forever. The task then gets its signal and the call a `ConnectionLostError`.
   */
  readonly idleInTransactionTimeoutMs?: number;
}

/** Options of {@link LockClient.runExclusiveJob}: always exclusive, never waits. */
export type ExclusiveJobOptions = Omit<TransactionLockOptions, 'mode' | 'wait' | 'timeoutMs'>;

/** Options of a session-scoped lock. */
export type SessionLockOptions = AcquireOptions;

/** What a task receives besides the driver's native handle. */
export interface TaskContext {
  /**
   * Aborted when the lock can no longer be trusted: the connection holding it errored, ended or
   * was terminated (Postgres has released the lock), or the caller's own `signal` aborted.
   * Long tasks should check it between steps.
   */
  readonly signal: AbortSignal;
  /** The lock being held. */
  readonly key: LockKey;
  /** Runs SQL on the lock's own connection (inside its transaction, for transaction scope). */
  readonly query: QueryFn;
}

/** A task run under a transaction-scoped lock, with the driver's transaction handle. */
export type TransactionTask<Tx, T> = (tx: Tx, ctx: TaskContext) => Promise<T> | T;

/** A task run under a session-scoped lock, with the driver's handle for the dedicated connection. */
export type SessionTask<Session, T> = (session: Session, ctx: TaskContext) => Promise<T> | T;

/** `{ executed: false }` when another holder had the lock; else the task's result. */
export type JobResult<T> =
  | { readonly executed: false }
  | { readonly executed: true; readonly result: T };

/**
 * The lock operations, bound to one executor. Made by {@link createLockClient}, or by an
 * adapter's `createLockKit(handle)`.
 */
export interface LockClient<Tx, Session> extends LeaseOperations<Tx> {
  /** The executor every operation runs on. */
  readonly executor: LockExecutor<Tx, Session>;

  /** The schema of lockkit's tables (leases, scheduler ledger). */
  readonly schema: string;

  /** The client's default `statementTimeoutMs`, if it has one (the scheduler bounds handlers by it). */
  readonly statementTimeoutMs: number | undefined;

  /**
   * Creates or upgrades lockkit's tables (leases) in the client's schema; safe to call from every
   * instance at start-up. See {@link migrate}.
   */
  migrate(): Promise<MigrationResult>;

  /**
   * Runs `task` on exactly one of the callers that race for `(namespace, jobKey)`.
   *
   * Inside one transaction it takes `pg_try_advisory_xact_lock(key1, key2)`
   * ({@link generateLockKeys}). The winner runs `task` with the driver's transaction handle, so
   * the task's own writes commit or roll back with the lock; the others get `{ executed: false }`
   * at once, without waiting. A throwing task rolls back, releases the lock and rethrows.
   * The decision costs two round trips on adapters that pipeline BEGIN with the try-lock.
   *
   * @example
   * ```ts
   * const r = await locks.runExclusiveJob('cron_jobs', 'generate_invoices', async (tx) => {
   *   await tx.query('INSERT INTO invoices …');
   *   return 42;
   * });
   * if (r.executed) console.log(r.result);
   * ```
   */
  runExclusiveJob<T>(
    namespace: string,
    jobKey: string,
    task: TransactionTask<Tx, T>,
    options?: ExclusiveJobOptions,
  ): Promise<JobResult<T>>;

  /**
   * Runs `task` holding `key` for one transaction (released at COMMIT or ROLLBACK).
   *
   * Try (default) or wait (`wait: true`, with `timeoutMs` and `signal`); exclusive (default) or
   * shared. Concurrency guarantee: while the task runs, no other holder has the key in a
   * conflicting mode, unless the task's `signal` fires (the connection died and the lock with it).
   */
  withLock<T>(
    key: LockKey,
    task: TransactionTask<Tx, T>,
    options?: TransactionLockOptions,
  ): Promise<JobResult<T>>;

  /**
   * Runs `task` holding a session-level lock on a dedicated connection, outside any transaction:
   * the lock survives the task's own commits and is released (one unlock for the one acquire)
   * in `finally`. Needs the executor's session capability; never use it through a
   * transaction-pooling proxy. Re-entrancy is Postgres's: on its own connection the task may take
   * the same key again, and each extra acquire then needs its own unlock.
   */
  withSessionLock<T>(
    key: LockKey,
    task: SessionTask<Session, T>,
    options?: SessionLockOptions,
  ): Promise<JobResult<T>>;
}

/** Options of one lock client: defaults of its calls, and where its tables live. */
export interface LockClientOptions {
  /** Schema of lockkit's tables (leases), validated and quoted. Default `lockkit`. */
  readonly schema?: string;
  /** Default `statementTimeoutMs` of transaction-scoped calls. */
  readonly statementTimeoutMs?: number;
  /** Default `idleInTransactionTimeoutMs` of transaction-scoped calls. */
  readonly idleInTransactionTimeoutMs?: number;
  /**
   * Called with a typed event for every lock and lease outcome (attempt, acquired, skipped, timed
   * out, released; lease claimed, renewed, lost, finished): the hook for metrics and tracing
   * (`@lockkit/otel`). Without it no event is built.
   */
  readonly onEvent?: LockkitEventListener;
  /**
   * Decide a skip (the key held elsewhere) in one round trip instead of two, where the executor
   * has the `firstThenBegin` capability (`@lockkit/pg`); elsewhere this changes nothing. The
   * try-lock and BEGIN travel as one query that fails when the lock is taken, so that no
   * transaction is ever opened for a skip. The cost: each skip is a failed statement on the
   * server — an ERROR line (and, with the default `log_min_error_statement`, the statement) in
   * its log, and a rolled-back transaction in `pg_stat_database`. The run path is unchanged:
   * 2 round trips. Default `false`.
   */
  readonly oneRoundTripSkip?: boolean;
}

const SKIPPED: JobResult<never> = Object.freeze({ executed: false });

/**
 * Recently used named keys: a cron job asks for the same (namespace, jobKey) on every tick, and
 * hashing it again each time is the largest piece of lockkit's own work per decision.
 */
const NAMED_KEY_CACHE_SIZE = 1024;
const namedKeys = new Map<string, LockKey>();

function namedKey(namespace: string, jobKey: string): LockKey {
  if (typeof namespace !== 'string' || typeof jobKey !== 'string') {
    return LockKey.fromNames(namespace, jobKey); // throws the typed error
  }
  const id = `${namespace.length}:${namespace}${jobKey}`;
  let key = namedKeys.get(id);
  if (!key) {
    key = LockKey.fromNames(namespace, jobKey);
    if (namedKeys.size >= NAMED_KEY_CACHE_SIZE) {
      namedKeys.delete(namedKeys.keys().next().value as string);
    }
    namedKeys.set(id, key);
  }
  return key;
}

/** The plain exclusive try-lock statement of a key (no settings), built once per key. */
const plainTryLocks = new WeakMap<LockKey, string>();

function tryLockOpening(key: LockKey, mode: LockMode, settings: readonly SettingValue[]): string {
  if (mode !== 'exclusive' || settings.length > 0)
    return inlineTryLockStatement(key, mode, settings);
  let text = plainTryLocks.get(key);
  if (text === undefined) {
    text = inlineTryLockStatement(key, mode, settings);
    plainTryLocks.set(key, text);
  }
  return text;
}

/** The failure a one-round-trip try-lock raises for a lock held elsewhere: a skip, not an error. */
function isSkipMarker(error: unknown): boolean {
  return (
    sqlState(error) === '22P02' &&
    error instanceof Error &&
    error.message.includes(`"${SKIP_MARKER}"`)
  );
}

/** Marks an error thrown by the user's task, so that it is rethrown unchanged. */
class TaskFailure {
  constructor(readonly error: unknown) {}
}

interface Plan {
  readonly mode: LockMode;
  readonly wait: boolean;
  readonly timeoutMs: number | undefined;
  readonly signal: AbortSignal | undefined;
  readonly settings: readonly SettingValue[];
}

function checkTask(task: unknown): void {
  if (typeof task !== 'function') {
    throw new LockkitError('OPTION_INVALID', 'The task must be a function.');
  }
}

function checkKey(key: unknown): LockKey {
  if (!(key instanceof LockKey)) {
    throw new LockkitError(
      'OPTION_INVALID',
      'The key must be a LockKey (LockKey.fromNames, fromPair or fromBigInt).',
    );
  }
  return key;
}

function plan(options: TransactionLockOptions, transactionScope: boolean): Plan {
  const mode = options.mode ?? 'exclusive';
  if (mode !== 'exclusive' && mode !== 'shared') {
    throw new LockkitError(
      'OPTION_INVALID',
      `mode must be 'exclusive' or 'shared', got ${String(mode)}.`,
    );
  }
  const wait = options.wait ?? false;
  if (typeof wait !== 'boolean') {
    throw new LockkitError('OPTION_INVALID', 'wait must be a boolean.');
  }
  if (options.timeoutMs !== undefined && !wait) {
    throw new LockkitError('OPTION_INVALID', 'timeoutMs only applies with wait: true.');
  }
  const timeoutMs =
    options.timeoutMs === undefined
      ? undefined
      : checkMilliseconds(options.timeoutMs, 'timeoutMs', 1);
  const signal = options.signal;
  if (signal !== undefined && !(signal instanceof AbortSignal)) {
    throw new LockkitError('OPTION_INVALID', 'signal must be an AbortSignal.');
  }
  const settings: SettingValue[] = [];
  if (
    !transactionScope &&
    (options.statementTimeoutMs !== undefined || options.idleInTransactionTimeoutMs !== undefined)
  ) {
    throw new LockkitError(
      'OPTION_INVALID',
      'statement and idle timeouts apply to transaction scope only.',
    );
  }
  if (options.statementTimeoutMs !== undefined) {
    settings.push([
      'statement_timeout',
      checkMilliseconds(options.statementTimeoutMs, 'statementTimeoutMs', 0),
    ]);
  }
  if (options.idleInTransactionTimeoutMs !== undefined) {
    settings.push([
      'idle_in_transaction_session_timeout',
      checkMilliseconds(options.idleInTransactionTimeoutMs, 'idleInTransactionTimeoutMs', 0),
    ]);
  }
  return { mode, wait, timeoutMs, signal, settings };
}

function abortedError(signal: AbortSignal, cause?: unknown): LockkitError {
  return new LockkitError(
    'ABORTED',
    'The operation was aborted by its signal before the lock was acquired.',
    {
      cause: cause ?? signal.reason,
    },
  );
}

function first(rows: Row[]): Row {
  const row = rows[0];
  if (!row) throw new LockkitError('EXECUTOR_INVALID', 'A lock statement returned no row.');
  return row;
}

/**
 * Classifies a failure of one whole operation: the task's own error is rethrown unchanged unless
 * the connection was lost (then the caller must learn that the lock went away); a lost
 * connection becomes {@link ConnectionLostError}; a cancelled wait `ABORTED`; Postgres errors
 * their typed error.
 */
function classify(
  error: unknown,
  what: string,
  context: { readonly signal: AbortSignal } | undefined,
  caller: AbortSignal | undefined,
): unknown {
  const original = error instanceof TaskFailure ? error.error : error;
  const connection = context?.signal;
  if (connection?.aborted) {
    const mapped = fromPostgresError(connection.reason, what);
    if (mapped instanceof ConnectionLostError || mapped instanceof TransactionExpiredError)
      return mapped;
    return new ConnectionLostError(
      `${what}: the connection holding the lock was lost; Postgres has released the lock.`,
      { cause: original === undefined ? connection.reason : original },
    );
  }
  // The task's own errors pass unchanged, except the Postgres failures that lockkit's options
  // cause or that end the lock (timeouts, deadlock, lost connection, full lock table).
  if (caller?.aborted && sqlState(original) === '57014') return abortedError(caller, original);
  return fromPostgresError(original, what);
}

/**
 * Binds the lock operations to an executor. Adapters wrap this as `createLockKit(handle)`.
 * @throws {@link LockkitError} `EXECUTOR_INVALID` when `executor` is not a LockExecutor.
 */
export function createLockClient<Tx, Session>(
  executor: LockExecutor<Tx, Session>,
  options: LockClientOptions = {},
): LockClient<Tx, Session> {
  assertLockExecutor(executor);
  const emit = emitter(options.onEvent);
  if (options.oneRoundTripSkip !== undefined && typeof options.oneRoundTripSkip !== 'boolean')
    throw new LockkitError('OPTION_INVALID', 'oneRoundTripSkip must be a boolean.');
  const oneTripSkips = options.oneRoundTripSkip === true && executor.firstThenBegin !== undefined;
  const defaults: LockClientOptions = {
    ...(options.statementTimeoutMs !== undefined && {
      statementTimeoutMs: checkMilliseconds(options.statementTimeoutMs, 'statementTimeoutMs', 0),
    }),
    ...(options.idleInTransactionTimeoutMs !== undefined && {
      idleInTransactionTimeoutMs: checkMilliseconds(
        options.idleInTransactionTimeoutMs,
        'idleInTransactionTimeoutMs',
        0,
      ),
    }),
  };

  /**
   * Cancels a lock wait from another connection; best effort, the wait may have ended. Settles,
   * never rejects, once the cancel's own transaction is over: the caller awaits it after its own
   * transaction (never inside it — with a pool of one, the cancel needs that very connection).
   */
  const cancelWait = (pid: number): Promise<void> => {
    const statement = cancelBackendStatement(pid);
    return executor
      .transaction((ctx) => ctx.query(statement.text, statement.params))
      .then(
        () => undefined,
        () => undefined,
      );
  };

  /** Waits on `query` for the lock, cancelling the wait when `signal` aborts. */
  const waitForLock = async (
    query: QueryFn,
    key: LockKey,
    p: Plan,
    pid: number | undefined,
    scope: 'transaction' | 'session',
    cancels: Promise<void>[],
  ): Promise<void> => {
    const statement = lockStatement(key, scope, p.mode, true);
    const onAbort = () => {
      if (pid !== undefined) cancels.push(cancelWait(pid));
    };
    p.signal?.addEventListener('abort', onAbort, { once: true });
    try {
      await query(statement.text, statement.params);
    } finally {
      p.signal?.removeEventListener('abort', onAbort);
    }
  };

  const runTask = async <H, T>(
    task: (handle: H, ctx: TaskContext) => Promise<T> | T,
    handle: H,
    key: LockKey,
    query: QueryFn,
    connection: { readonly signal: AbortSignal },
    caller: AbortSignal | undefined,
  ): Promise<T> => {
    // Built on first read: a task that never looks at its signal costs no AbortSignal.
    let signal: AbortSignal | undefined;
    const context: TaskContext = {
      get signal() {
        signal ??= caller ? AbortSignal.any([connection.signal, caller]) : connection.signal;
        return signal;
      },
      key,
      query,
    };
    try {
      return await task(handle, context);
    } catch (error) {
      throw new TaskFailure(error);
    }
  };

  async function withLock<T>(
    key: LockKey,
    task: TransactionTask<Tx, T>,
    callOptions: TransactionLockOptions = {},
  ): Promise<JobResult<T>> {
    checkKey(key);
    checkTask(task);
    const p = plan({ ...defaults, ...callOptions }, true);
    if (p.signal?.aborted) throw abortedError(p.signal);
    let connection: TransactionContext<Tx> | undefined;

    const settings: SettingValue[] = [...p.settings];
    if (p.wait && p.timeoutMs !== undefined) settings.unshift(['lock_timeout', p.timeoutMs]);
    // Waiting: first statement sets the timeouts and reports the pid; try: it takes the lock.
    const oneTrip = oneTripSkips && !p.wait;
    const opening = p.wait
      ? inlinePrepareStatement(settings)
      : oneTrip
        ? oneTripTryLockStatement(key, p.mode, settings)
        : tryLockOpening(key, p.mode, settings);

    const tracker = track(emit, key, 'transaction', p.mode, p.wait);
    // Cancels of this call's wait, sent on other connections: the call settles after them.
    const cancels: Promise<void>[] = [];
    const body = async (ctx: TransactionContext<Tx>, openingRows: Row[]): Promise<JobResult<T>> => {
      connection = ctx;
      if (p.wait) {
        await waitForLock(
          ctx.query,
          key,
          p,
          first(openingRows).pid as number,
          'transaction',
          cancels,
        );
        // Got it, but the caller gave up meanwhile: the rollback releases it.
        if (p.signal?.aborted) throw abortedError(p.signal);
      } else if (first(openingRows).acquired !== true) {
        tracker.skipped();
        return SKIPPED;
      }
      tracker.acquired();
      const result = await runTask(task, ctx.tx, key, ctx.query, ctx, p.signal);
      return { executed: true, result };
    };

    try {
      const result =
        oneTrip && executor.firstThenBegin
          ? await executor.firstThenBegin(opening, body)
          : executor.pipelinedTransaction
            ? await executor.pipelinedTransaction(opening, body)
            : await executor.transaction(async (ctx) => body(ctx, await ctx.query(opening)));
      if (result.executed) tracker.settled(undefined);
      return result;
    } catch (error) {
      if (oneTrip && connection === undefined && isSkipMarker(error)) {
        tracker.skipped();
        return SKIPPED;
      }
      const classified = classify(error, `lock ${key}`, connection, p.signal);
      tracker.settled(classified);
      throw classified;
    } finally {
      if (cancels.length > 0) await Promise.all(cancels);
    }
  }

  /** Set once a transaction pooler has been detected under this client's executor. */
  let poolerDetected = false;
  /** Direct, session pooler or transaction pooler: checked on the first session call. */
  const pinning = new SessionPinning(executor);

  const poolerError = (how: 'declared' | 'detected', detail: string) =>
    new UnsafeBehindPoolerError(
      `Session scope is refused on the ${executor.name} executor: ${detail} Behind a transaction pooler a session lock stays on a server connection that the next, unrelated client inherits. Use withLock/runExclusiveJob (transaction scope) or a lease.`,
      how,
    );

  async function withSessionLock<T>(
    key: LockKey,
    task: SessionTask<Session, T>,
    callOptions: SessionLockOptions = {},
  ): Promise<JobResult<T>> {
    checkKey(key);
    checkTask(task);
    requireCapability(
      executor,
      'session',
      'Use a transaction-scoped lock, or a lease for long jobs.',
    );
    if (executor.transactionPooler) {
      throw poolerError('declared', 'it was declared to go through a transaction pooler.');
    }
    if (poolerDetected) {
      throw poolerError('detected', 'a transaction pooler was detected on an earlier call.');
    }
    const p = plan(callOptions, false);
    if (p.signal?.aborted) throw abortedError(p.signal);
    let connection: SessionContext<Session> | undefined;
    const tracker = track(emit, key, 'session', p.mode, p.wait);
    const cancels: Promise<void>[] = [];
    const detected = (serverPid: unknown, expectedPid: unknown) => {
      poolerDetected = true;
      return poolerError(
        'detected',
        `this connection's statements were expected on backend ${String(expectedPid)}, but the server ran one on backend ${String(serverPid)}: a pooler moved it; no lock was taken.`,
      );
    };
    try {
      const result = await executor.session(async (ctx): Promise<JobResult<T>> => {
        connection = ctx;
        // The backend every lock statement of this connection must reach: its own on a direct
        // connection or behind a session-mode pooler; behind a transaction pooler, a refusal.
        const pin = await pinning.pin(ctx);
        if ('refused' in pin) {
          poolerDetected = true;
          throw poolerError('detected', pin.refused);
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
            await waitForLock(ctx.query, key, p, holderPid, 'session', cancels);
            await ctx.query(COMMIT);
          } catch (error) {
            if (!ctx.signal.aborted) {
              await ctx.query(ROLLBACK).catch(() => {});
              // A wait cut short (timeout, cancel) just as the lock was granted keeps the
              // session lock through the rollback: give it back.
              const held = heldStatement(key, p.mode);
              const rows = await ctx.query(held.text, held.params).catch(() => [{ held: 0 }]);
              if (Number(first(rows).held) > 0) await release(ctx.query, key, p.mode, -1, error);
            }
            throw error;
          }
          // Got it, but the caller gave up meanwhile: a session lock outlives the transaction,
          // so it needs its unlock.
          if (p.signal?.aborted) {
            await release(ctx.query, key, p.mode, holderPid, undefined);
            throw abortedError(p.signal);
          }
        } else {
          const statement =
            expectedPid === undefined
              ? lockStatement(key, 'session', p.mode, false)
              : guardedSessionLockStatement(key, p.mode, false, expectedPid);
          const row = first(await ctx.query(statement.text, statement.params));
          holderPid = row.pid as number;
          if (row.acquired === null) throw detected(holderPid, expectedPid);
          if (row.acquired !== true) {
            tracker.skipped();
            return SKIPPED;
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
        await release(
          ctx.query,
          key,
          p.mode,
          holderPid,
          outcome.ok ? undefined : outcome.failure.error,
        );
        if (!outcome.ok) throw outcome.failure;
        return { executed: true, result: outcome.result };
      });
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
   * One unlock for the one acquire, sent only to the backend that holds the lock (`holderPid`;
   * -1 when this very connection is known to hold it). A lock that is no longer held is an
   * error, never silence; a statement that reached another backend means a pooler moved us.
   */
  const release = async (
    query: QueryFn,
    key: LockKey,
    mode: LockMode,
    holderPid: number,
    taskError: unknown,
  ): Promise<void> => {
    const unlock = async () => {
      const pid =
        holderPid === -1
          ? Number(first(await query('SELECT pg_backend_pid() AS pid')).pid)
          : holderPid;
      const statement = unlockStatement(key, mode, pid);
      return first(await query(statement.text, statement.params));
    };
    let row: Row;
    try {
      row = await unlock();
    } catch (error) {
      // The task left a failed transaction open on the session: end it, then unlock.
      if (sqlState(error) !== '25P02') throw error;
      await query(ROLLBACK);
      row = await unlock();
    }
    if (row.released === null) {
      poolerDetected = true;
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
  };

  const schemaName = options.schema ?? DEFAULT_SCHEMA;
  const leases = leaseOperations(
    executor,
    (key, task, claimOptions) => withLock(key, (_tx, ctx) => task(ctx.query), claimOptions),
    quoteIdentifier(schemaName),
    emit,
  );

  return Object.freeze({
    executor,
    schema: schemaName,
    statementTimeoutMs: defaults.statementTimeoutMs,
    withLock,
    withSessionLock,
    ...leases,
    migrate: () => migrate(executor as LockExecutor, { schema: schemaName }),
    async runExclusiveJob<T>(
      namespace: string,
      jobKey: string,
      task: TransactionTask<Tx, T>,
      jobOptions: ExclusiveJobOptions = {},
    ): Promise<JobResult<T>> {
      const { signal, statementTimeoutMs, idleInTransactionTimeoutMs } = jobOptions;
      return withLock(namedKey(namespace, jobKey), task, {
        ...(signal !== undefined && { signal }),
        ...(statementTimeoutMs !== undefined && { statementTimeoutMs }),
        ...(idleInTransactionTimeoutMs !== undefined && { idleInTransactionTimeoutMs }),
      });
    },
  });
}
