/**
 * What every conformance case shares: the adapter description, a fresh adapter instance per test
 * under its own `application_name`, and an outside observer — a plain `pg` connection that reads
 * `pg_locks` and `pg_stat_activity` and never asks the adapter anything.
 */
import { randomBytes, randomInt } from 'node:crypto';
import { createLockClient, type JobResult, type LockExecutor, LockKey } from '@lockkit/core';
import pg from 'pg';

/** The lock protocols the fault-point group searches, statement by statement. */
export type FaultProtocolId =
  | 'run-exclusive-job'
  | 'with-lock-try-shared'
  | 'with-lock-wait-exclusive'
  | 'with-lock-wait-shared'
  | 'with-session-lock-try'
  | 'with-session-lock-wait'
  | 'run-with-lease';

/**
 * The lock protocols the dead-start group runs on a pooled connection whose far side just hung up
 * (see `cases/dead-start.ts`).
 */
export type DeadStartProtocolId =
  | 'run-exclusive-job'
  | 'with-lock-try'
  | 'with-lock-wait'
  | 'with-session-lock'
  | 'run-with-lease';

/**
 * Where the dead-start group runs, and what hangs up: `terminated`, straight at PostgreSQL, a
 * backend terminated; `pooler-hung-up`, through a transaction-mode PgBouncer, PgBouncer's end of
 * the client link.
 */
export type DeadStartPath = 'terminated' | 'pooler-hung-up';

/**
 * The scheduler and schema operations the fault-point group searches (see
 * `cases/fault-points-scheduler.ts`): one tick in transaction mode, one in lease mode, a tick that
 * catches up ticks nobody ran, and `migrate()` on a fresh schema.
 */
export type SchedulerFaultOperationId =
  | 'scheduler-tick-transaction'
  | 'scheduler-tick-lease'
  | 'scheduler-catch-up'
  | 'migrate';

/**
 * The faults the fault-point group puts at each statement boundary: the link cut before the
 * statement reaches the server, or after it ran there and before its answer; its answer held past
 * the caller's timeout (the signal fires) and then delivered; the backend terminated from outside,
 * or the caller's signal fired, while the statement is held before the server.
 */
export type FaultKind = 'drop-before' | 'drop-after' | 'late-reply' | 'terminated' | 'aborted';

/** Every case of the suite, by id; `disable` takes these. */
export type ConformanceCaseId =
  | `faults.${FaultProtocolId}.${FaultKind}`
  | `faults.${SchedulerFaultOperationId}.${FaultKind}`
  | `dead-start.${DeadStartPath}.${DeadStartProtocolId}`
  | 'transaction.exactly-one-of-50'
  | 'transaction.release-on-commit'
  | 'transaction.release-on-throw'
  | 'transaction.native-handle-joins'
  | 'transaction.shared-and-exclusive'
  | 'transaction.blocking-waits'
  | 'transaction.blocking-timeout'
  | 'transaction.abort-cancels-wait'
  | 'transaction.terminated-holder'
  | 'transaction.savepoint-rollback'
  | 'transaction.int8-keys'
  | 'transaction.statement-timeout'
  | 'transaction.idle-in-transaction-timeout'
  | 'transaction.bad-input'
  | 'session.survives-commit'
  | 'session.reentrant-and-stacking'
  | 'session.released-on-error'
  | 'session.no-state-leaks'
  | 'session.blocking'
  | 'session.separate-connections'
  | 'session.unlocked-behind-our-back'
  | 'session.terminated-holder'
  | 'pipelining.two-round-trips'
  | 'pipelining.one-trip-skip'
  | 'robustness.counter-fuzz'
  | 'robustness.mixed-operations'
  | 'leases.migrate-idempotent'
  | 'leases.exactly-one-of-50'
  | 'leases.no-lock-or-connection-while-running'
  | 'leases.renewal-keeps-it'
  | 'leases.stalled-holder-loses'
  | 'leases.tokens-increase'
  | 'leases.token-epoch'
  | 'leases.finish-survives-a-lost-reply'
  | 'leases.killed-holder-process'
  | 'leases.bad-options-and-abort'
  | 'leases.claim-keeps-margin'
  | 'leases.no-two-holders-after-fence'
  | 'leases.claim-never-waits'
  | 'leases.slow-contender'
  | 'leases.own-fence-keeps-renewing'
  | 'leases.holder-reported'
  | 'leases.keep-alive-fuzz'
  | 'scheduler.registration-errors'
  | 'scheduler.exactly-once-skewed'
  | 'scheduler.owned-exactly-once-skewed'
  | 'scheduler.failure-recorded'
  | 'scheduler.overlap-skip'
  | 'scheduler.catch-up'
  | 'scheduler.catch-up-hole'
  | 'scheduler.lease-mode'
  | 'scheduler.graceful-stop'
  | 'scheduler.worker-processes'
  | 'scheduler.runner-dies-not-skipped'
  | 'scheduler.runner-between-locks-not-skipped'
  | 'scheduler.runner-dies-between-locks-not-skipped'
  | 'scheduler.lease-claimant-held-not-skipped'
  | 'scheduler.lease-claimant-dies-not-skipped'
  | 'scheduler.lease-stuck-claim-of-another-tick-overlaps'
  | 'scheduler.hung-lease-handler-lets-go'
  | 'scheduler.lease-runner-dies'
  | 'scheduler.lease-fenced-write-lost-gives-back'
  | 'scheduler.lease-fenced-own-error-fails'
  | 'scheduler.lease-fenced-write-lost-bounded'
  | 'scheduler.lease-due-row-locked-waits'
  | 'scheduler.lease-queue-row-locked-in-order'
  | 'scheduler.schedule-change'
  | 'scheduler.latest-after-outage'
  | 'scheduler.queue-in-ledger'
  | 'scheduler.queue-oldest-first'
  | 'scheduler.catch-up-not-a-queue'
  | 'scheduler.lease-jittered-tick-not-judged'
  | 'scheduler.missed-reported-when-committed'
  | 'scheduler.queue-due-tick-waits-its-turn'
  | 'scheduler.queue-skewed-due-at-tick'
  | 'scheduler.pending-not-due-followed-up'
  | 'scheduler.queue-committed-after-drain'
  | 'scheduler.queue-holder-stopping'
  | 'scheduler.stop-gives-back-skewed'
  | 'scheduler.latest-catch-up-held'
  | 'scheduler.lease-waiting-tick-not-judged'
  | 'scheduler.latest-once-per-outage'
  | 'scheduler.lease-fast-clock-waits'
  | 'scheduler.caught-sql-error-is-failed'
  | 'scheduler.timeout-bounds-handler'
  | 'scheduler.stop-gives-back'
  | 'scheduler.retry-durable'
  | 'scheduler.namespaces'
  | 'scheduler.schedule-conflict'
  | 'scheduler.long-delay'
  | 'scheduler.simulated-years'
  | 'scheduler.jitter-keeps-ticks'
  | 'scheduler.unstorable-names'
  | 'scheduler.jitter-bound'
  | 'scheduler.dom-and-dow'
  | 'scheduler.run-info'
  | 'scheduler.jitter-rolling-deploy'
  | 'scheduler.generated-schedules'
  | 'pooler.hazard-reproduced'
  | 'pooler.session-refused-when-declared'
  | 'pooler.session-refused-when-detected'
  | 'pooler.session-mode-allowed'
  | 'truth.task-ended-transaction'
  | 'truth.caught-error-is-not-executed'
  | 'truth.fenced-caught-error-is-not-written'
  | 'truth.fenced-commit-truth'
  | 'truth.lost-commit-reply-is-unknown'
  | 'truth.late-cancel-hits-nobody-else'
  | 'truth.lost-opening-is-typed'
  | 'truth.session-open-transaction-rolled-back'
  | 'truth.session-reacquired-key-freed'
  | 'truth.one-trip-skip-any-language'
  | 'truth.pool-of-one-abort'
  | 'truth.pool-wait-abort'
  | 'truth.pool-of-one-nested'
  | 'truth.caller-transaction-open'
  | 'truth.commit-failure-is-typed'
  | 'engine.real-server-passes'
  | 'engine.first-calls-share-one-test'
  | 'engine.stub-refused'
  | 'engine.stub-refused-on-one-connection'
  | 'standby.run-exclusive-job'
  | 'transaction.abort-while-queued'
  | 'transaction.abort-while-queued.one-trip'
  | 'session.abort-while-queued'
  | 'transaction.abort-while-self-test-queued'
  | 'session.abort-while-self-test-queued'
  | 'standby.recovery-check-not-shadowed'
  | 'standby.with-lock'
  | 'standby.session-lock'
  | 'standby.lease'
  | 'standby.migrate'
  | 'standby.scheduler-ticks';

/**
 * An adapter over ONE connection that the caller also uses directly (a `pg.Client`): the caller
 * may open its own transaction on it, or call lockkit again from inside a task.
 */
export interface SingleConnectionInstance<Tx, Session> {
  readonly executor: LockExecutor<Tx, Session>;
  /** Runs SQL on the connection directly, as the caller's own code would (not through lockkit). */
  query(text: string): Promise<unknown>;
  close(): Promise<void>;
}

/** One adapter instance under test, over its own connections. */
export interface AdapterInstance<Tx, Session> {
  readonly executor: LockExecutor<Tx, Session>;
  /** Connections currently checked out of the adapter's pool, when the driver can tell. */
  checkedOut?(): number | Promise<number>;
  /** Closes every connection of this instance. */
  close(): Promise<void>;
}

/** A hot standby server started for the standby group, stopped once the group is done. */
export interface StandbyServer {
  /** Where the standby accepts (read-only) connections. */
  readonly url: string;
  stop(): Promise<void>;
}

/** What an adapter package hands to {@link runConformance}. */
export interface ConformanceAdapter<Tx, Session> {
  /** Shown in test names. */
  readonly name: string;
  /** URL of a real PostgreSQL (in lockkit's own tests, `testDatabaseUrl()` of `@lockkit/test-db`). */
  readonly databaseUrl: () => string;
  /**
   * Makes an instance over a new driver handle (a pool of at least `poolSize` connections) on
   * `url`. Synchronous: drivers connect lazily.
   */
  readonly createInstance: (options: {
    readonly url: string;
    readonly poolSize: number;
    /** Declare a transaction pooler to the executor (its `transactionPooler` option). */
    readonly transactionPooler?: boolean;
  }) => AdapterInstance<Tx, Session>;
  /** Where the observer connects; default {@link ConformanceAdapter.databaseUrl}. Always direct. */
  readonly observerUrl?: () => string;
  /**
   * A transaction-mode PgBouncer in front of the same database (`testPgBouncer()` of
   * `@lockkit/test-db`), or why there is none. With it, the transaction, pipelining and
   * robustness groups run again through PgBouncer, and the pooler group proves session scope is
   * refused there; without it those groups are skipped visibly with the reason.
   */
  readonly pgbouncer?: () =>
    | {
        readonly url: string;
        readonly singleConnectionUrl: string;
        /** The same database through PgBouncer in session mode: session scope must work there. */
        readonly sessionModeUrl?: string;
      }
    | { readonly missing: string };
  /**
   * Runs SQL through the driver's native transaction handle, as a user's task would; enables the
   * case proving that such writes join the lock's transaction.
   */
  readonly nativeQuery?: (tx: Tx, text: string) => Promise<unknown>;
  /**
   * Absolute path of an ES module, runnable by plain `node`, that exports a `createInstance`
   * function of the same shape as {@link ConformanceAdapter.createInstance}: the leases group
   * runs it in a worker process that it then kills.
   */
  readonly workerModule?: string;
  /**
   * Makes an executor over one connection the caller also holds (node-postgres: a `pg.Client`);
   * enables the cases about a caller's own transaction and nested calls on one connection.
   */
  readonly singleConnection?: (url: string) => Promise<SingleConnectionInstance<Tx, Session>>;
  /**
   * Starts a real hot standby (a server in recovery, read-only), calling `prepare` with its URL
   * while it is still a primary (the group creates lockkit's tables there, as a replica of a
   * migrated primary has them); in lockkit's own tests, `startEmbeddedPostgres({ standby: true,
   * prepare })` of `@lockkit/test-db/embedded`. With it, the standby group proves every lock and
   * claim is refused there with `NotPrimaryError`; without it, the group is skipped visibly.
   */
  readonly standby?: (options: {
    readonly prepare: (primaryUrl: string) => Promise<void>;
  }) => Promise<StandbyServer>;
  /** Cases this adapter cannot pass, each with the reason shown in the skipped test's name. */
  readonly disable?: Partial<Readonly<Record<ConformanceCaseId, string>>>;
  /**
   * Known defects: cases that run and are expected to FAIL (vitest `it.fails`), each with the
   * reason shown in the test's name. A case listed here that starts passing fails the run, so the
   * entry must go when the defect is fixed.
   */
  readonly expectedFailures?: Partial<Readonly<Record<ConformanceCaseId, string>>>;
}

/** A random key no other test uses. */
export function randomKey(): LockKey {
  return LockKey.fromNames('lockkit-conformance', randomBytes(12).toString('hex'));
}

/** A random int8 key, negative half the time. */
export function randomInt8Key(): LockKey {
  const high = BigInt(randomInt(0, 2 ** 31)) * (randomInt(2) ? 1n : -1n);
  return LockKey.fromBigInt((high << 32n) | BigInt(randomInt(0, 2 ** 32 - 1)));
}

/** A URL that tags connections with `application_name`. */
export function taggedUrl(url: string, applicationName: string): string {
  const tagged = new URL(url);
  tagged.searchParams.set('application_name', applicationName);
  return tagged.toString();
}

/** One advisory lock as the observer sees it. */
export interface ObservedLock {
  readonly pid: number;
  readonly key: LockKey;
  readonly mode: 'ExclusiveLock' | 'ShareLock';
  readonly granted: boolean;
}

/** The outside view: its own connection to the database, reading catalog views only. */
export class Observer {
  private constructor(private readonly client: pg.Client) {}

  /** Connects an observer to `url`. */
  static async connect(url: string): Promise<Observer> {
    const client = new pg.Client({
      connectionString: taggedUrl(url, 'lockkit-conformance-observer'),
    });
    client.on('error', () => {});
    await client.connect();
    return new Observer(client);
  }

  /** Runs SQL on the observer's own connection. */
  async query<R extends pg.QueryResultRow>(text: string, params: unknown[] = []): Promise<R[]> {
    return (await this.client.query<R>(text, params)).rows;
  }

  /** Advisory locks held or awaited by connections tagged `applicationName`. */
  async locksOf(applicationName: string): Promise<ObservedLock[]> {
    const rows = await this.query<{
      pid: number;
      classid: string;
      objid: string;
      objsubid: number;
      mode: ObservedLock['mode'];
      granted: boolean;
    }>(
      `SELECT l.pid, l.classid::text, l.objid::text, l.objsubid::int AS objsubid, l.mode, l.granted
         FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
        WHERE l.locktype = 'advisory' AND a.application_name = $1
          AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
      [applicationName],
    );
    return rows.map((r) => ({
      pid: r.pid,
      key: LockKey.fromPgLocks(r),
      mode: r.mode,
      granted: r.granted,
    }));
  }

  /** Holders and waiters of `key`, by anyone. */
  async locksOn(key: LockKey): Promise<ObservedLock[]> {
    const { classid, objid, objsubid } = key.pgLocks;
    const rows = await this.query<{ pid: number; mode: ObservedLock['mode']; granted: boolean }>(
      `SELECT pid, mode, granted FROM pg_locks
        WHERE locktype = 'advisory' AND classid = $1::int8::oid AND objid = $2::int8::oid
          AND objsubid = $3 AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
      [classid, objid, objsubid],
    );
    return rows.map((r) => ({ ...r, key }));
  }

  /**
   * Connections tagged `applicationName` left inside a transaction. (Running statements are not
   * counted: drivers run their own background queries, e.g. postgres.js fetching array types.)
   */
  async busyConnectionsOf(
    applicationName: string,
  ): Promise<{ pid: number; state: string; query: string }[]> {
    return this.query(
      `SELECT pid, state, left(query, 200) AS query FROM pg_stat_activity
        WHERE application_name = $1 AND state LIKE 'idle in transaction%'`,
      [applicationName],
    );
  }

  /** Terminates a backend, as an administrator or a failing proxy would. */
  async terminate(pid: number): Promise<void> {
    await this.query('SELECT pg_terminate_backend($1)', [pid]);
  }

  /** Polls every `pollMs` until `check` holds or `ms` pass; returns whether it held. */
  async until(check: () => Promise<boolean>, ms = 5000, pollMs = 20): Promise<boolean> {
    const deadline = Date.now() + ms;
    for (;;) {
      if (await check()) return true;
      if (Date.now() > deadline) return false;
      await new Promise((r) => setTimeout(r, pollMs));
    }
  }

  async close(): Promise<void> {
    await this.client.end();
  }
}

/** A promise with its resolver, for making one task wait for another. */
export function gate<T = void>(): { promise: Promise<T>; open: (value: T) => void } {
  let open!: (value: T) => void;
  const promise = new Promise<T>((resolve) => {
    open = resolve;
  });
  return { promise, open };
}

/** One turn of the event loop: every promise chain that needs no I/O has settled after it. */
export const turn = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

/**
 * Holds `size` connections of `executor` (calls of a client without the engine self-test, in
 * `scope`, each stopped in its task) until `release` opens: a pool of `size` is then exhausted.
 * `holders` are those calls; each resolves executed once released.
 */
export async function occupyPool<Tx, Session>(
  executor: LockExecutor<Tx, Session>,
  size: number,
  scope: 'transaction' | 'session',
): Promise<{ release: { open: () => void }; holders: Promise<JobResult<void>>[] }> {
  const locks = createLockClient(executor, { engineSelfTest: false });
  const release = gate();
  const holders: Promise<JobResult<void>>[] = [];
  for (let i = 0; i < size; i++) {
    const started = gate();
    const task = async (): Promise<void> => {
      started.open();
      await release.promise;
    };
    holders.push(
      scope === 'transaction'
        ? locks.withLock(randomKey(), task)
        : locks.withSessionLock(randomKey(), task),
    );
    await started.promise;
  }
  return { release, holders };
}

/** Resolves when `signal` aborts, or rejects after `ms`. */
export function aborted(signal: AbortSignal, ms: number): Promise<unknown> {
  return new Promise((resolve, reject) => {
    if (signal.aborted) {
      resolve(signal.reason);
      return;
    }
    const timer = setTimeout(() => reject(new Error(`signal did not abort within ${ms} ms`)), ms);
    signal.addEventListener(
      'abort',
      () => {
        clearTimeout(timer);
        resolve(signal.reason);
      },
      { once: true },
    );
  });
}

/** Captures the rejection of `promise`, failing if it resolves. */
export async function rejection(promise: Promise<unknown>): Promise<unknown> {
  try {
    await promise;
  } catch (error) {
    return error;
  }
  throw new Error('expected the operation to reject, it resolved');
}
