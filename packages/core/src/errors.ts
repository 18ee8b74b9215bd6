/**
 * Typed errors of lockkit.
 *
 * Every error lockkit raises is a {@link LockkitError} with a machine-readable {@link LockkitErrorCode}.
 * Subclasses exist only where a caller is expected to branch on them. The original error (a driver
 * error, a Postgres error) is kept as the ES2022 `cause`, and the stack is never blanked.
 *
 * @packageDocumentation
 */

/** Codes carried by a {@link LockKeyError}: what exactly is wrong with a lock key input. */
export type LockKeyErrorCode =
  | 'KEY_NOT_STRING'
  | 'KEY_EMPTY'
  | 'KEY_MALFORMED'
  | 'KEY_TOO_LONG'
  | 'KEY_NOT_INTEGER'
  | 'KEY_OUT_OF_RANGE'
  | 'KEY_NOT_ADVISORY';

/**
 * Every code a {@link LockkitError} can carry. See docs/errors.md for what each means and what to
 * do; for example `POOL_TIMEOUT`: the driver's pool lent no connection within its acquire timeout
 * (node-postgres's `connectionTimeoutMillis`, Knex's `acquireConnectionTimeout`), so the call did
 * not run and took no lock.
 */
export type LockkitErrorCode =
  | LockKeyErrorCode
  | 'CAPABILITY_UNSUPPORTED'
  | 'EXECUTOR_INVALID'
  | 'OPTION_INVALID'
  | 'LOCK_TIMEOUT'
  | 'DEADLOCK'
  | 'IDLE_IN_TRANSACTION_TIMEOUT'
  | 'STATEMENT_TIMEOUT'
  | 'CONNECTION_LOST'
  | 'POOL_TIMEOUT'
  | 'LOCK_TABLE_FULL'
  | 'LOCK_NOT_HELD'
  | 'UNSAFE_BEHIND_POOLER'
  | 'LEASE_LOST'
  | 'TRANSACTION_EXPIRED'
  | 'COMMIT_ROLLED_BACK'
  | 'COMMIT_OUTCOME_UNKNOWN'
  | 'AFTER_COMMIT_FAILED'
  | 'CALLER_TRANSACTION_OPEN'
  | 'NESTED_CALL'
  | 'ABORTED'
  | 'NOT_PRIMARY'
  | 'ENGINE_LOCKS_NOT_REAL';

/** The brand that {@link isLockkitError} checks; `Symbol.for` so it is shared by every copy of the package. */
const LOCKKIT_ERROR_BRAND: unique symbol = Symbol.for('lockkit.error') as never;

/** Options accepted by every lockkit error constructor. */
export interface LockkitErrorOptions {
  /** The underlying error, kept as the standard ES2022 `cause`. */
  readonly cause?: unknown;
}

/**
 * Base class of every error lockkit throws.
 *
 * Prefer {@link isLockkitError} over `instanceof`: two copies of `@lockkit/core` in one
 * `node_modules` have two different classes, but share the brand.
 *
 * @example
 * ```ts
 * try { await locks.runExclusiveJob('billing', 'nightly', task); }
 * catch (err) { if (isLockkitError(err) && err.code === 'LOCK_TIMEOUT') retryLater(); else throw err; }
 * ```
 */
export class LockkitError extends Error {
  /** What went wrong, stable across versions. */
  readonly code: LockkitErrorCode;
  /** @internal brand checked by {@link isLockkitError} */
  readonly [LOCKKIT_ERROR_BRAND] = true;

  constructor(code: LockkitErrorCode, message: string, options: LockkitErrorOptions = {}) {
    super(message, 'cause' in options ? { cause: options.cause } : undefined);
    this.name = 'LockkitError';
    this.code = code;
  }
}

/**
 * Thrown before any SQL is sent when a lock key input is not usable: a name that is not a
 * non-empty string within {@link MAX_KEY_NAME_BYTES}, a number that is not an int32, a bigint
 * outside int64, or a `pg_locks` row that is not an advisory lock.
 */
export class LockKeyError extends LockkitError {
  declare readonly code: LockKeyErrorCode;

  constructor(code: LockKeyErrorCode, message: string, options: LockkitErrorOptions = {}) {
    super(code, message, options);
    this.name = 'LockKeyError';
  }
}

/**
 * Thrown before any SQL is sent when an operation needs an executor capability (a dedicated
 * session, a pipelined BEGIN) that the adapter in use does not provide. The message names the adapter.
 */
export class UnsupportedCapabilityError extends LockkitError {
  /** The adapter's name, as it reports it in `LockExecutor.name`. */
  readonly adapter: string;
  /** The missing capability. */
  readonly capability: string;

  constructor(adapter: string, capability: string, hint?: string) {
    super(
      'CAPABILITY_UNSUPPORTED',
      `The ${adapter} adapter does not support ${capability}.${hint ? ` ${hint}` : ''}`,
    );
    this.name = 'UnsupportedCapabilityError';
    this.adapter = adapter;
    this.capability = capability;
  }
}

/**
 * A blocking acquisition waited longer than its `timeoutMs` (Postgres `lock_timeout`, SQLSTATE
 * 55P03). The lock was not taken and the task did not run.
 */
export class LockTimeoutError extends LockkitError {
  declare readonly code: 'LOCK_TIMEOUT';

  constructor(message: string, options: LockkitErrorOptions = {}) {
    super('LOCK_TIMEOUT', message, options);
    this.name = 'LockTimeoutError';
  }
}

/**
 * Postgres chose this transaction as the victim of a deadlock (SQLSTATE 40P01): it was rolled
 * back and its locks released. Retrying the whole operation is safe.
 */
export class DeadlockError extends LockkitError {
  declare readonly code: 'DEADLOCK';

  constructor(message: string, options: LockkitErrorOptions = {}) {
    super('DEADLOCK', message, options);
    this.name = 'DeadlockError';
  }
}

/**
 * The connection holding the lock is gone: it errored, ended, or its backend was terminated
 * (SQLSTATE 57P01, `idle_in_transaction_session_timeout` 25P03, an admin's `pg_terminate_backend`,
 * a network cut). Every lock it held has been released by Postgres, so another worker may already
 * be running the same job; the task's `signal` was aborted when this was noticed. Whether the
 * task's writes were committed is unknown only if the loss happened during COMMIT.
 */
export class ConnectionLostError extends LockkitError {
  declare readonly code: 'CONNECTION_LOST' | 'IDLE_IN_TRANSACTION_TIMEOUT';

  constructor(
    message: string,
    options: LockkitErrorOptions & { readonly idleInTransactionTimeout?: boolean } = {},
  ) {
    super(
      options.idleInTransactionTimeout ? 'IDLE_IN_TRANSACTION_TIMEOUT' : 'CONNECTION_LOST',
      message,
      options,
    );
    this.name = 'ConnectionLostError';
  }
}

/**
 * Postgres's shared lock table is full (SQLSTATE 53200, "out of shared memory"). Too many locks
 * are held at once across the server: release locks sooner, or raise `max_locks_per_transaction`
 * (the table has `max_locks_per_transaction × (max_connections + max_prepared_transactions)`
 * slots; the setting needs a server restart).
 */
export class LockTableFullError extends LockkitError {
  declare readonly code: 'LOCK_TABLE_FULL';

  constructor(message: string, options: LockkitErrorOptions = {}) {
    super('LOCK_TABLE_FULL', message, options);
    this.name = 'LockTableFullError';
  }
}

/**
 * A session lock that lockkit took was not held any more when it went to release it
 * (`pg_advisory_unlock` returned false): someone ran `pg_advisory_unlock_all()` or an extra
 * unlock on that connection. Mutual exclusion may have been broken while the task ran.
 */
export class LockNotHeldError extends LockkitError {
  declare readonly code: 'LOCK_NOT_HELD';

  constructor(message: string, options: LockkitErrorOptions = {}) {
    super('LOCK_NOT_HELD', message, options);
    this.name = 'LockNotHeldError';
  }
}

/**
 * Session scope was refused because the connection goes through a transaction-pooling proxy:
 * declared by the user (`transactionPooler: true`) or detected by lockkit (the backend pid the
 * driver got at startup is not the server's `pg_backend_pid()`). A session lock there would stay
 * on a server connection that the next, unrelated client inherits. Use transaction scope
 * (`withLock`, `runExclusiveJob`) or a lease.
 */
export class UnsafeBehindPoolerError extends LockkitError {
  declare readonly code: 'UNSAFE_BEHIND_POOLER';
  /** `'declared'` by the executor option, or `'detected'` from the backend pid. */
  readonly reason: 'declared' | 'detected';

  constructor(message: string, reason: 'declared' | 'detected') {
    super('UNSAFE_BEHIND_POOLER', message);
    this.name = 'UnsafeBehindPoolerError';
    this.reason = reason;
  }
}

/**
 * A lease's holder lost it: a renewal found another token in the row, no renewal succeeded before
 * the local deadline (expiry minus a safety margin, on a monotonic clock), or the completion or a
 * fenced write was refused because a newer holder has claimed the job. The task's signal fired
 * when this was noticed; another worker may be running the job.
 */
export class LeaseLostError extends LockkitError {
  declare readonly code: 'LEASE_LOST';
  /** The fencing token that was lost. */
  readonly token: bigint;

  constructor(message: string, token: bigint, options: LockkitErrorOptions = {}) {
    super('LEASE_LOST', message, options);
    this.name = 'LeaseLostError';
    this.token = token;
  }
}

/**
 * The client library ended the lock's transaction because it ran past the library's own time
 * limit (Prisma's interactive-transaction `timeout`, or its `maxWait` for a connection). The
 * transaction was rolled back and its lock released; `option` names the setting to raise.
 */
export class TransactionExpiredError extends LockkitError {
  declare readonly code: 'TRANSACTION_EXPIRED';
  /** The adapter option that bounded the transaction. */
  readonly option: string;

  constructor(message: string, option: string, options: LockkitErrorOptions = {}) {
    super('TRANSACTION_EXPIRED', message, options);
    this.name = 'TransactionExpiredError';
    this.option = option;
  }
}

/**
 * The task returned normally but its transaction did not commit: a statement inside it failed
 * (often one the task caught itself), so Postgres answered COMMIT with ROLLBACK. Nothing the task
 * wrote was kept; the lock was released. Treat the run as failed (a scheduler records the tick
 * failed and retries per its policy).
 */
export class CommitRolledBackError extends LockkitError {
  declare readonly code: 'COMMIT_ROLLED_BACK';

  constructor(message: string, options: LockkitErrorOptions = {}) {
    super('COMMIT_ROLLED_BACK', message, options);
    this.name = 'CommitRolledBackError';
  }
}

/**
 * The connection died after COMMIT was sent and before its answer arrived: the transaction may or
 * may not have committed, and the lock is released either way. Do not blindly retry — read what
 * the task writes (a ledger row, an idempotency key) to learn whether it committed.
 */
export class CommitOutcomeUnknownError extends LockkitError {
  declare readonly code: 'COMMIT_OUTCOME_UNKNOWN';

  constructor(message: string, options: LockkitErrorOptions = {}) {
    super('COMMIT_OUTCOME_UNKNOWN', message, options);
    this.name = 'CommitOutcomeUnknownError';
  }
}

/**
 * The transaction committed — the task's writes are kept and the lock is released — and then
 * something the driver runs after COMMIT failed (a TypeORM `afterTransactionCommit` subscriber,
 * say). The run succeeded as far as the database is concerned: do not run the task again for it.
 * `cause` holds the failure.
 *
 * @example
 * ```ts
 * try { await locks.runExclusiveJob('billing', 'nightly', task); }
 * catch (err) { if (isLockkitError(err) && err.code === 'AFTER_COMMIT_FAILED') report(err.cause); else throw err; }
 * ```
 */
export class AfterCommitError extends LockkitError {
  declare readonly code: 'AFTER_COMMIT_FAILED';

  constructor(message: string, options: LockkitErrorOptions = {}) {
    super('AFTER_COMMIT_FAILED', message, options);
    this.name = 'AfterCommitError';
  }
}

/**
 * The server that would have granted the lock (or recorded the claim) is not a writable primary:
 * it is a hot standby in recovery, or it refused the write as read-only. Advisory locks on a
 * standby are real only on that server, so every instance reaching a replica would "win" at
 * once. Nothing ran. Point lockkit at the primary (a writer endpoint, not a reader endpoint),
 * and make sure no router sends lockkit's statements to a replica.
 */
export class NotPrimaryError extends LockkitError {
  declare readonly code: 'NOT_PRIMARY';
  /**
   * How it was found: `'in-recovery'` (the statement that took the lock saw
   * `pg_is_in_recovery()` true) or `'read-only'` (the server refused a write, SQLSTATE 25006).
   */
  readonly reason: 'in-recovery' | 'read-only';

  constructor(
    message: string,
    reason: 'in-recovery' | 'read-only',
    options: LockkitErrorOptions = {},
  ) {
    super('NOT_PRIMARY', message, options);
    this.name = 'NotPrimaryError';
    this.reason = reason;
  }
}

/**
 * The engine behind the connection answered an advisory-lock call without holding a lock: the
 * self-test lockkit runs on first use found that a second session could not see the lock in
 * `pg_locks`, or could take it too. A stub function, a Postgres-compatible engine that silently
 * ignores advisory locks, or a router that splits sessions would give every caller the lock at
 * once. `found` says what the self-test saw; `server` identifies the server (its version string).
 */
export class EngineLocksNotRealError extends LockkitError {
  declare readonly code: 'ENGINE_LOCKS_NOT_REAL';
  /** What the self-test observed, in words. */
  readonly found: string;
  /** The server's `version()` string, when it could be read. */
  readonly server: string | undefined;

  constructor(
    message: string,
    found: string,
    server: string | undefined,
    options: LockkitErrorOptions = {},
  ) {
    super('ENGINE_LOCKS_NOT_REAL', message, options);
    this.name = 'EngineLocksNotRealError';
    this.found = found;
    this.server = server;
  }
}

/**
 * True for any error thrown by any copy of lockkit, checked by a `Symbol.for` brand rather than
 * by class identity.
 */
export function isLockkitError(value: unknown): value is LockkitError {
  return (
    typeof value === 'object' &&
    value !== null &&
    (value as { [LOCKKIT_ERROR_BRAND]?: unknown })[LOCKKIT_ERROR_BRAND] === true
  );
}
