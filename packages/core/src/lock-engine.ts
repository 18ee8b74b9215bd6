/**
 * The small context every lock module works over ({@link LockEngine}: one executor, its options,
 * its event emitter, its pooler state), and the helpers they share: validating a call, planning
 * it, running the task, classifying a failure.
 *
 * @packageDocumentation
 */
import { isConnectionLoss } from './connection-loss.js';
import type { EngineTrust } from './engine-self-test.js';
import {
  ConnectionLostError,
  LockkitError,
  NotPrimaryError,
  TransactionExpiredError,
} from './errors.js';
import type { emitter } from './events.js';
import type { LockExecutor, QueryFn, Row } from './executor.js';
import { LockKey } from './keys.js';
import type {
  JobResult,
  LockClientOptions,
  TaskContext,
  TransactionLockOptions,
} from './lock-types.js';
import { poolTimeoutError } from './pool-timeout.js';
import { fromPostgresError, sqlState } from './postgres-errors.js';
import type { SessionPinning } from './session-pinning.js';
import {
  checkMilliseconds,
  inlineTryLockStatement,
  type LockMode,
  type SettingValue,
  SKIP_MARKER,
  STANDBY_MARKER,
} from './sql/locks.js';

/** What one lock client's operations share. */
export interface LockEngine<Tx, Session> {
  readonly executor: LockExecutor<Tx, Session>;
  /** Emits the client's typed events (a no-op without a listener). */
  readonly emit: ReturnType<typeof emitter>;
  /** One-round-trip skips requested and possible on this executor. */
  readonly oneTripSkips: boolean;
  /** Validated defaults of transaction-scoped calls. */
  readonly defaults: LockClientOptions;
  /** Direct, session pooler or transaction pooler: checked on the first session call. */
  readonly pinning: SessionPinning;
  /** Set once a transaction pooler has been detected under this executor. */
  poolerDetected: boolean;
  /** Whether the server's advisory locks are real: the engine self-test, run on first use. */
  readonly trust: EngineTrust;
}

export const SKIPPED: JobResult<never> = Object.freeze({ executed: false });

/**
 * Recently used named keys: a cron job asks for the same (namespace, jobKey) on every tick, and
 * hashing it again each time is the largest piece of lockkit's own work per decision.
 */
const NAMED_KEY_CACHE_SIZE = 1024;
const namedKeys = new Map<string, LockKey>();

export function namedKey(namespace: string, jobKey: string): LockKey {
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

export function tryLockOpening(
  key: LockKey,
  mode: LockMode,
  settings: readonly SettingValue[],
): string {
  if (mode !== 'exclusive' || settings.length > 0)
    return inlineTryLockStatement(key, mode, settings);
  let text = plainTryLocks.get(key);
  if (text === undefined) {
    text = inlineTryLockStatement(key, mode, settings);
    plainTryLocks.set(key, text);
  }
  return text;
}

/**
 * The failure a one-round-trip try-lock raises for a lock held elsewhere: a skip, not an error.
 * Known by its SQLSTATE and the marker, which Postgres echoes verbatim in every language (only
 * the words and quotes around it are translated).
 */
export function isSkipMarker(error: unknown): boolean {
  return (
    sqlState(error) === '22P02' && error instanceof Error && error.message.includes(SKIP_MARKER)
  );
}

/**
 * The failure a one-round-trip try-lock raises on a server in recovery (see {@link isSkipMarker}).
 */
export function isStandbyMarker(error: unknown): boolean {
  return (
    sqlState(error) === '22P02' && error instanceof Error && error.message.includes(STANDBY_MARKER)
  );
}

/**
 * The refusal of a lock taken on a server in recovery. `cause`: the marker's error, for the
 * one-round-trip try-lock.
 */
export function inRecovery(what: string, cause?: unknown): NotPrimaryError {
  return new NotPrimaryError(
    `${what}: the server is a hot standby (pg_is_in_recovery() is true), where an advisory lock excludes only other sessions of that replica; no lock was taken and nothing ran. Point lockkit at the primary (a writer endpoint, not a reader endpoint).`,
    'in-recovery',
    cause === undefined ? {} : { cause },
  );
}

/**
 * Refuses a lock statement's row that reports the server in recovery (its `in_recovery` column):
 * throws {@link NotPrimaryError}. Called before anything reads `acquired`.
 */
export function refuseInRecovery(row: Row, what: string): void {
  if (row.in_recovery === true) throw inRecovery(what);
}

/**
 * Marks an error thrown by the user's task, so that it is rethrown unchanged. An executor's
 * transaction callback rejects with it when the task threw; `error` is what the task threw.
 */
export class TaskFailure {
  /** @param error What the task threw. */
  constructor(readonly error: unknown) {}
}

export interface Plan {
  readonly mode: LockMode;
  readonly wait: boolean;
  readonly timeoutMs: number | undefined;
  readonly signal: AbortSignal | undefined;
  readonly settings: readonly SettingValue[];
}

export function checkTask(task: unknown): void {
  if (typeof task !== 'function') {
    throw new LockkitError('OPTION_INVALID', 'The task must be a function.');
  }
}

export function checkKey(key: unknown): LockKey {
  if (!(key instanceof LockKey)) {
    throw new LockkitError(
      'OPTION_INVALID',
      'The key must be a LockKey (LockKey.fromNames, fromPair or fromBigInt).',
    );
  }
  return key;
}

export function plan(options: TransactionLockOptions, transactionScope: boolean): Plan {
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

export function abortedError(signal: AbortSignal, cause?: unknown): LockkitError {
  return new LockkitError(
    'ABORTED',
    'The operation was aborted by its signal before the lock was acquired.',
    {
      cause: cause ?? signal.reason,
    },
  );
}

export function first(rows: Row[]): Row {
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
export function classify(
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
  // lockkit's own statement (the opening, the lock wait, COMMIT) hit a dead link before the
  // executor noticed: a driver error with no SQLSTATE (node-postgres's "Connection terminated
  // unexpectedly"), which must not reach the caller raw. A task's own error passes unchanged: it
  // may come from a connection of the task's that is not the lock's.
  if (
    !(error instanceof TaskFailure) &&
    !(error instanceof LockkitError) &&
    isConnectionLoss(error)
  )
    return new ConnectionLostError(
      `${what}: the connection was lost before lockkit's statement was answered; Postgres releases every lock held there, and a transaction open there rolls back.`,
      { cause: error },
    );
  // The pool lent no connection in time: nothing of the call reached the server.
  if (context === undefined && !(error instanceof TaskFailure)) {
    const refused = poolTimeoutError(error, what);
    if (refused) return refused;
  }
  // The task's own errors pass unchanged, except the Postgres failures that lockkit's options
  // cause or that end the lock (timeouts, deadlock, lost connection, full lock table).
  if (caller?.aborted && sqlState(original) === '57014') return abortedError(caller, original);
  return fromPostgresError(original, what);
}

/**
 * The {@link TaskContext} of one run. A class, so that its lazy `signal` getter lives on the
 * prototype: an object literal with an accessor costs more to build than the rest of a run's
 * JavaScript.
 */
class RunningTask implements TaskContext {
  private built: AbortSignal | undefined;

  constructor(
    readonly key: LockKey,
    readonly query: QueryFn,
    private readonly connection: { readonly signal: AbortSignal },
    private readonly caller: AbortSignal | undefined,
  ) {}

  /** Built on first read: a task that never looks at its signal costs no AbortSignal. */
  get signal(): AbortSignal {
    this.built ??= this.caller
      ? AbortSignal.any([this.connection.signal, this.caller])
      : this.connection.signal;
    return this.built;
  }
}

/** Runs the user's task with its context; its own error comes out wrapped in a TaskFailure. */
export async function runTask<H, T>(
  task: (handle: H, ctx: TaskContext) => Promise<T> | T,
  handle: H,
  key: LockKey,
  query: QueryFn,
  connection: { readonly signal: AbortSignal },
  caller: AbortSignal | undefined,
): Promise<T> {
  const context = new RunningTask(key, query, connection, caller);
  try {
    return await task(handle, context);
  } catch (error) {
    throw new TaskFailure(error);
  }
}
