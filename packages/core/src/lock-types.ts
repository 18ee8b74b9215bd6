/**
 * The public types of the lock engine: options, tasks, results and the {@link LockClient}.
 *
 * @packageDocumentation
 */
import type { EngineSelfTestResult } from './engine-self-test.js';
import type { LockkitEventListener } from './events.js';
import type { LockExecutor, QueryFn } from './executor.js';
import type { LockKey } from './keys.js';
import type { LeaseOperations } from './lease.js';
import type { MigrationResult } from './migrate.js';
import type { LockMode } from './sql/locks.js';

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
   * Runs the engine self-test now, once for this client (lock calls run it themselves on first
   * use; call this to fail at start-up instead, or with `engineSelfTest: false`): a first session
   * takes an advisory lock, a second must see it in `pg_locks` and be refused it. Resolves with
   * what it saw; rejects with `EngineLocksNotRealError` when the server's locks are not real
   * (every later lock call of this client is then refused too).
   *
   * @example
   * ```ts
   * const { method, server } = await locks.verifyEngine(); // 'two-sessions', 'PostgreSQL 18.1 …'
   * ```
   */
  verifyEngine(): Promise<EngineSelfTestResult>;

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
   * the lock survives the task's own commits and is released in `finally`. Needs the executor's
   * session capability; never use it through a transaction-pooling proxy. Re-entrancy is
   * Postgres's: on its own connection the task may take the same key again. The connection goes
   * back to its pool clean: a transaction the task left open (or failed) is rolled back, and
   * every hold of the key on it is freed, extra levels the task took included; a connection that
   * cannot be made clean is discarded.
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
  /**
   * Before the first lock call of this client is trusted, check once that the server's advisory
   * locks are real (a second session must see the lock in `pg_locks` and be refused it), and
   * refuse every lock call with `EngineLocksNotRealError` when they are not: a stub function, an
   * engine that answers `true` without locking, or a router that splits sessions would otherwise
   * let every caller run. It costs the first call about three round trips (two statements and
   * their rollbacks; a second pooled connection if none is open yet). Turn it off (`false`) only
   * for a server you know is a real PostgreSQL and a start-up that cannot spare those round
   * trips; {@link LockClient.verifyEngine} still runs it on demand. Default `true`.
   */
  readonly engineSelfTest?: boolean;
}
