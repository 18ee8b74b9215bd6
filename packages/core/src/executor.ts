/**
 * The seam between lockkit and a database driver.
 *
 * An adapter (`@lockkit/pg`, `@lockkit/postgres`, …) implements {@link LockExecutor}: one required
 * callback-shaped method and optional ones. Every statement lockkit sends is written in core and
 * passed through `query`; an adapter only knows how its driver opens a transaction or pins a
 * connection. Callback shapes make a leaked connection impossible to write: the adapter gets the
 * connection back when the callback settles, whatever happens inside.
 *
 * @packageDocumentation
 */
import { LockkitError, UnsupportedCapabilityError } from './errors.js';

/** One result row: column name to value, exactly as the driver returns it. */
export type Row = Record<string, unknown>;

/**
 * Sends one SQL statement with positional parameters (`$1`, `$2`, …) on the connection the
 * callback was given, and resolves with its rows.
 */
export type QueryFn = (text: string, params?: readonly unknown[]) => Promise<Row[]>;

/** What a transaction callback receives. */
export interface TransactionContext<Tx> {
  /** Runs core's SQL inside this transaction. */
  readonly query: QueryFn;
  /** The driver's native transaction handle; the user's own writes through it join this transaction. */
  readonly tx: Tx;
  /**
   * Aborted when the connection under this transaction errors, ends or is terminated: the
   * transaction, and every lock it holds, is then gone.
   */
  readonly signal: AbortSignal;
  /**
   * Optional: `signal.aborted`, read without making the signal (a getter over the adapter's
   * `ConnectionFate`). Core reads it once per run, to tell a connection lost before COMMIT
   * (a certain rollback) from one lost while COMMIT was in flight (an unknown outcome).
   */
  readonly lost?: boolean;
  /**
   * Optional: cancels the statement running on this connection with the protocol's own
   * CancelRequest, sent on a socket of its own (so it needs no second pooled connection).
   * Resolves once the server has taken the request. A connection that was ever interrupted must
   * not go back to a pool (the executor discards it), so a late cancel can never reach the next
   * user. Without it, core cancels a wait from another pooled connection, guarded so that it only
   * hits a backend still waiting for that very lock.
   */
  readonly interrupt?: () => Promise<void>;
  /**
   * Optional: whether the transaction lockkit opened has ended since — the task sent COMMIT,
   * ROLLBACK or COMMIT AND CHAIN itself, and the transaction-scoped lock went with it. `true` or
   * `false` when the driver can tell (node-postgres reads every ReadyForQuery's status);
   * `undefined` when it cannot this time: core then asks the server, with one short statement,
   * before COMMIT.
   */
  readonly ended?: () => boolean | undefined;
}

/** What a session callback receives: one dedicated connection, outside any transaction. */
export interface SessionContext<Session> {
  /** Runs core's SQL on this connection, each statement in its own implicit transaction. */
  readonly query: QueryFn;
  /** The driver's native handle for this connection. */
  readonly session: Session;
  /** Aborted when the connection errors, ends or is terminated: its session locks are then gone. */
  readonly signal: AbortSignal;
  /**
   * The backend pid the driver was told at connection startup (BackendKeyData), when the driver
   * exposes it. Core compares it with `pg_backend_pid()` to detect a transaction pooler: behind
   * PgBouncer the startup pid is PgBouncer's own invention and never matches.
   */
  readonly backendPid?: number | undefined;
  /**
   * Optional: whether the connection is inside a transaction block (open or failed), from the
   * driver's last ReadyForQuery. Without it, core asks the server (two short statements) after a
   * session task, to roll back a transaction the task left open.
   */
  readonly inTransaction?: () => boolean;
  /** Optional: as {@link TransactionContext.interrupt}. */
  readonly interrupt?: () => Promise<void>;
  /**
   * Optional: asks the executor not to return this connection to its pool as it is: after every
   * session task (whatever the task did to its session, the next pool user must not inherit it),
   * and when core could not make it clean (an unknown transaction state, a hold it could not
   * free). Close it; or, where closing one connection would hurt the driver's other queries, reset
   * it with `SESSION_RESET` (from `@lockkit/core/adapter`) and close it only if that fails.
   */
  readonly discard?: () => void;
}

/**
 * The smallest thing an adapter implements.
 *
 * Contract of every method: exactly one connection is used for the whole callback and is used by
 * nothing else meanwhile; it is always given back to its pool when the callback settles (discarded
 * instead when it broke); the callback's rejection is passed through unchanged.
 *
 * @typeParam Tx - the driver's native transaction handle handed to user tasks.
 * @typeParam Session - the driver's native handle for a dedicated connection.
 *
 * @example
 * ```ts
 * const executor: LockExecutor<PoolClient> = {
 *   name: 'my-driver',
 *   async transaction(fn) { … BEGIN; try { r = await fn(ctx); COMMIT } catch { ROLLBACK; throw } finally { release } },
 * };
 * ```
 */
export interface LockExecutor<Tx = unknown, Session = unknown> {
  /** The adapter's name, used in error messages (`'pg'`, `'prisma'`, …). */
  readonly name: string;

  /**
   * True when the user declared that connections go through a transaction-pooling proxy
   * (PgBouncer in transaction mode, Supavisor, RDS Proxy, pgcat). Core then refuses session scope
   * before sending anything: a session lock would stay on a server connection that the next,
   * unrelated client inherits.
   */
  readonly transactionPooler?: boolean;

  /**
   * True when the executor has one connection only (a single client, a pool of one): two of its
   * transactions can never be open at once. The engine self-test then checks on one session
   * instead of waiting for a second that cannot come. Leave it unset when unknown.
   */
  readonly singleConnection?: boolean;

  /**
   * True when the executor reads COMMIT's answer and rejects with `CommitRolledBackError` when it
   * says ROLLBACK (the transaction had failed). Executors that cannot see the command tag leave it
   * unset: core then checks, with one cheap statement just before COMMIT, that the transaction is
   * not aborted, so a task that caught its own SQL error is never reported as executed.
   */
  readonly commitReportsRollback?: boolean;

  /**
   * Required. Runs `fn` inside one transaction on one connection: BEGIN before it, COMMIT when it
   * resolves, ROLLBACK when it rejects (then rethrows its error).
   */
  transaction<T>(fn: (ctx: TransactionContext<Tx>) => Promise<T>): Promise<T>;

  /**
   * Optional: the session capability. Runs `fn` on one dedicated connection outside any
   * transaction, so that session-level locks outlive commits. Adapters whose driver cannot pin a
   * connection omit it.
   */
  session?<T>(fn: (ctx: SessionContext<Session>) => Promise<T>): Promise<T>;

  /**
   * Optional: the pipelining capability. Like {@link LockExecutor.transaction}, but sends `BEGIN`
   * and `first` to the server in one round trip, and hands `fn` the rows of `first`.
   * `first` is one complete statement written by core, with no parameters (its values are
   * validated integers inlined by core), so it can travel in a simple-protocol query.
   *
   * `beforeSend`, when given, is called once the executor holds its connection and before it
   * sends anything on it. When it throws, the executor sends nothing, gives the connection back
   * as healthy, and rejects with that error. (Core's calls abandoned while they waited for a
   * pooled connection: `first` takes the lock, and a caller who has left must not hold it even
   * for one round trip.)
   */
  pipelinedTransaction?<T>(
    first: string,
    fn: (ctx: TransactionContext<Tx>, firstRows: Row[]) => Promise<T>,
    beforeSend?: () => void,
  ): Promise<T>;

  /**
   * Optional: the statement-then-BEGIN capability, behind one-round-trip skips
   * (`LockClientOptions.oneRoundTripSkip`). Sends `${first}; BEGIN` as ONE simple-protocol query.
   * Postgres runs both in an implicit transaction block, which the BEGIN turns into the explicit
   * transaction: when the query succeeds, `fn` runs inside that transaction (with the rows of
   * `first`), followed by COMMIT — or ROLLBACK when `fn` rejects — as in
   * {@link LockExecutor.pipelinedTransaction}. When the query fails, Postgres has rolled the block
   * back and skipped the BEGIN, so the connection is idle and clean: the executor must send no
   * ROLLBACK, must give the connection back as healthy, and must rethrow the driver's error
   * unchanged (core reads it). `first` has no parameters, and `beforeSend` is honoured, like
   * `pipelinedTransaction`'s.
   */
  firstThenBegin?<T>(
    first: string,
    fn: (ctx: TransactionContext<Tx>, firstRows: Row[]) => Promise<T>,
    beforeSend?: () => void,
  ): Promise<T>;
}

/** The optional capabilities an executor may have. */
export type ExecutorCapability = 'session' | 'pipelinedTransaction' | 'firstThenBegin';

const CAPABILITY_DESCRIPTIONS: Record<ExecutorCapability, string> = {
  session: 'session-scoped operations (a dedicated connection outside any transaction)',
  pipelinedTransaction: 'sending BEGIN and the first statement in one round trip',
  firstThenBegin: 'sending a statement and then BEGIN in one round trip (one-round-trip skips)',
};

/** True when `executor` implements `capability`. */
export function hasCapability<Tx, Session>(
  executor: LockExecutor<Tx, Session>,
  capability: ExecutorCapability,
): boolean {
  return typeof executor[capability] === 'function';
}

/**
 * Fails early, before any SQL is sent, when `executor` lacks `capability`: throws an
 * {@link UnsupportedCapabilityError} naming the adapter, with an optional hint on what to use instead.
 */
export function requireCapability<Tx, Session, C extends ExecutorCapability>(
  executor: LockExecutor<Tx, Session>,
  capability: C,
  hint?: string,
): asserts executor is LockExecutor<Tx, Session> & Required<Pick<LockExecutor<Tx, Session>, C>> {
  if (!hasCapability(executor, capability)) {
    throw new UnsupportedCapabilityError(executor.name, CAPABILITY_DESCRIPTIONS[capability], hint);
  }
}

/**
 * Checks that `value` has the shape of a {@link LockExecutor}: a non-empty `name`, a
 * `transaction` function, and functions (or nothing) for the optional methods.
 * @throws {@link LockkitError} with code `EXECUTOR_INVALID`.
 */
export function assertLockExecutor(value: unknown): asserts value is LockExecutor {
  const candidate = value as Partial<Record<keyof LockExecutor, unknown>> | null;
  if (typeof candidate !== 'object' || candidate === null) {
    throw new LockkitError('EXECUTOR_INVALID', 'A LockExecutor must be an object.');
  }
  if (typeof candidate.name !== 'string' || candidate.name.length === 0) {
    throw new LockkitError('EXECUTOR_INVALID', 'A LockExecutor needs a non-empty string name.');
  }
  if (typeof candidate.transaction !== 'function') {
    throw new LockkitError(
      'EXECUTOR_INVALID',
      `The ${candidate.name} executor has no transaction() method.`,
    );
  }
  for (const optional of ['session', 'pipelinedTransaction', 'firstThenBegin'] as const) {
    const method = candidate[optional];
    if (method !== undefined && typeof method !== 'function') {
      throw new LockkitError(
        'EXECUTOR_INVALID',
        `The ${candidate.name} executor's ${optional} must be a function when present.`,
      );
    }
  }
}
