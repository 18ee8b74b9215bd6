/**
 * Seeing what is locked: advisory locks decoded back to names, who waits for whom, how full the
 * lock table is, and what leases and the scheduler ledger say.
 *
 * @packageDocumentation
 */
import { LockkitError } from './errors.js';
import { assertLockExecutor, type LockExecutor, type Row } from './executor.js';
import { LockKey } from './keys.js';
import { SCHEDULER_NAMESPACE } from './scheduler-namespace.js';
import { quoteIdentifier } from './sql/identifiers.js';
import {
  ADVISORY_LOCK_SAMPLE,
  ADVISORY_LOCKS,
  jobsStatement,
  LOCK_TABLE_CAPACITY,
  latestRunsStatement,
  leasesStatement,
  tablesStatement,
} from './sql/inspect.js';

/** Names lockkit can decode keys back to. Add the (namespace, job key) pairs your code uses. */
export class KeyNames {
  private readonly byKey = new Map<string, { namespace: string; jobKey: string }>();

  /** Remembers `(namespace, jobKey)`; returns this registry. */
  add(namespace: string, jobKey: string): this {
    const key = LockKey.fromNames(namespace, jobKey);
    this.byKey.set(String(key.pair), { namespace, jobKey });
    return this;
  }

  /** The names of `key`, when known. */
  lookup(key: LockKey): { namespace: string; jobKey: string } | undefined {
    return key.pair ? this.byKey.get(String(key.pair)) : undefined;
  }
}

/** One advisory lock held or awaited, as {@link inspect} reports it. */
export interface InspectedLock {
  readonly pid: number;
  readonly key: LockKey;
  /** The names the key was made from, when lockkit knows them. */
  readonly names: { readonly namespace: string; readonly jobKey: string } | undefined;
  readonly mode: 'exclusive' | 'shared';
  readonly granted: boolean;
  readonly applicationName: string | null;
  readonly clientAddress: string | null;
  readonly user: string | null;
  readonly state: string | null;
  readonly transactionAgeMs: number | null;
  /** How long a waiting request has waited (null when granted). */
  readonly waitingMs: number | null;
  /** The pids this backend waits for. */
  readonly blockedBy: readonly number[];
}

/** The lock table's size and use. */
export interface LockTableCapacity {
  readonly slots: number;
  readonly used: number;
  readonly advisory: number;
  /** `used / slots`. */
  readonly ratio: number;
  /** True when `ratio` is above the warning threshold. */
  readonly warning: boolean;
}

/** A lease as {@link inspect} reports it. */
export interface InspectedLease {
  readonly namespace: string;
  readonly jobKey: string;
  readonly token: bigint;
  readonly status: string;
  readonly owner: string | null;
  /** IN_PROGRESS and not expired. */
  readonly held: boolean;
  readonly expiresAt: Date | null;
  readonly claimedAt: Date | null;
  readonly finishedAt: Date | null;
  readonly attempts: number;
  readonly lastError: string | null;
}

/** One ledger row. */
export interface InspectedRun {
  readonly job: string;
  readonly tick: Date;
  readonly status: string;
  /** Who ran it: the scheduler's `owner` (by default `host:pid:random`). */
  readonly owner: string | null;
  readonly attempt: number;
  readonly token: bigint | null;
  readonly startedAt: Date | null;
  readonly finishedAt: Date | null;
  readonly error: string | null;
}

/**
 * A scheduled job's ledger summary. The counts and `lastSuccess` cover the job's latest `window`
 * ledger rows only (`total` of them exist), so reading them costs the same on a week-long ledger
 * as on a minute-long one.
 */
export interface InspectedJob {
  readonly job: string;
  /** The newest tick in the ledger. */
  readonly lastTick: Date | null;
  /** The newest SUCCEEDED tick within the window (null: none there). */
  readonly lastSuccess: Date | null;
  /**
   * Ticks that were run: SUCCEEDED, FAILED, RUNNING and ABANDONED rows — not MISSED (nobody ran
   * it) nor SKIPPED_OVERLAP (not run because the previous run was still going).
   */
  readonly ran: number;
  readonly succeeded: number;
  readonly failed: number;
  /** Ticks nobody ran. */
  readonly missed: number;
  readonly skippedOverlap: number;
  /** Runs whose holder died before recording an end. */
  readonly abandoned: number;
  readonly running: number;
  /** Rows within the window, of every status (at most `window`). */
  readonly total: number;
  /** How many of the job's latest rows the counts cover ({@link InspectOptions.jobWindow}). */
  readonly window: number;
  /** The job's newest rows, newest first ({@link InspectOptions.runsPerJob} of them). */
  readonly recent: readonly InspectedRun[];
}

/** Everything {@link inspect} saw. */
export interface Inspection {
  readonly locks: readonly InspectedLock[];
  readonly capacity: LockTableCapacity;
  /** Empty when the lease table does not exist (no `migrate()` yet). */
  readonly leases: readonly InspectedLease[];
  readonly jobs: readonly InspectedJob[];
  /** The newest ledger rows over all jobs, newest first ({@link InspectOptions.recentRuns}). */
  readonly recentRuns: readonly InspectedRun[];
}

/** Options of {@link inspect}. */
export interface InspectOptions {
  /** Schema of lockkit's tables (default `lockkit`). */
  readonly schema?: string;
  /** Extra names to decode keys with (leases and scheduler jobs are decoded on their own). */
  readonly names?: KeyNames;
  /** Capacity warning threshold, 0–1 (default 0.8). */
  readonly warnAbove?: number;
  /** How many of the newest ledger rows, over all jobs, to return: 0–1000 (default 50). */
  readonly recentRuns?: number;
  /** How many of each job's newest ledger rows to return in `InspectedJob.recent`: 0–1000 (default 10). */
  readonly runsPerJob?: number;
  /** How many of each job's newest ledger rows the per-job counts cover: 1–100,000 (default 1000). */
  readonly jobWindow?: number;
}

const num = (v: unknown): number | null => (v === null || v === undefined ? null : Number(v));
const date = (v: unknown): Date | null =>
  v === null || v === undefined ? null : new Date(v as string);

function count(value: unknown, name: string, min: number, max: number, fallback: number): number {
  if (value === undefined) return fallback;
  if (typeof value !== 'number' || !Number.isInteger(value) || value < min || value > max) {
    throw new LockkitError(
      'OPTION_INVALID',
      `${name} must be an integer from ${min} to ${max}; got ${JSON.stringify(value) ?? String(value)}.`,
    );
  }
  return value;
}

/** Checked options, with their defaults. */
function checkOptions(options: InspectOptions) {
  if (typeof options !== 'object' || options === null) {
    throw new LockkitError('OPTION_INVALID', 'inspect() options must be an object.');
  }
  const schemaName = options.schema ?? 'lockkit';
  const schema = quoteIdentifier(schemaName);
  const warnAbove = options.warnAbove ?? 0.8;
  if (typeof warnAbove !== 'number' || !(warnAbove >= 0 && warnAbove <= 1)) {
    throw new LockkitError(
      'OPTION_INVALID',
      `warnAbove must be a number from 0 to 1; got ${String(warnAbove)}.`,
    );
  }
  if (options.names !== undefined && !(options.names instanceof KeyNames)) {
    throw new LockkitError('OPTION_INVALID', 'names must be a KeyNames (new KeyNames().add(…)).');
  }
  return {
    schemaName,
    schema,
    warnAbove,
    names: options.names ?? new KeyNames(),
    recentRuns: count(options.recentRuns, 'recentRuns', 0, 1000, 50),
    runsPerJob: count(options.runsPerJob, 'runsPerJob', 0, 1000, 10),
    jobWindow: count(options.jobWindow, 'jobWindow', 1, 100_000, 1000),
  };
}

/** The fields of a `pg_locks` row (joined with its backend's activity) both views share. */
function sampledLockOf(r: Row, names: KeyNames): SampledLock {
  const key = LockKey.fromPgLocks({
    classid: r.classid as string,
    objid: r.objid as string,
    objsubid: r.objsubid as number,
  });
  return {
    pid: Number(r.pid),
    key,
    names: names.lookup(key),
    mode: r.mode === 'ShareLock' ? 'shared' : 'exclusive',
    granted: r.granted === true,
    applicationName: (r.application_name as string | null) ?? null,
    clientAddress: (r.client_addr as string | null) ?? null,
    user: (r.user_name as string | null) ?? null,
  };
}

const runOf = (r: Row): InspectedRun => ({
  job: r.job as string,
  tick: new Date(r.tick as string),
  status: r.status as string,
  owner: (r.owner as string | null) ?? null,
  attempt: Number(r.attempt),
  token: r.token === null || r.token === undefined ? null : BigInt(r.token as string),
  startedAt: date(r.started_at),
  finishedAt: date(r.finished_at),
  error: (r.error as string | null) ?? null,
});

/**
 * Reads, in one transaction, every advisory lock in the current database (decoded to names where
 * lockkit can: registered names, every lease, every scheduled job), who blocks whom, the lock
 * table's headroom, the lease table, and each scheduled job's latest ledger rows.
 *
 * Its cost does not grow with the ledger: jobs are listed by one index probe each and each job's
 * rows are read newest first from the primary key, `jobWindow` at most. Options are checked
 * before any SQL is sent.
 *
 * @throws {@link LockkitError} `OPTION_INVALID` for a bad option (a count that is not an integer
 * in range, a bad schema name, …), before any SQL.
 *
 * @example
 * ```ts
 * const { locks, capacity } = await inspect(pgExecutor(pool));
 * for (const l of locks) console.log(l.names ?? l.key, l.granted ? `held by ${l.pid}` : `waiting on ${l.blockedBy}`);
 * ```
 */
export async function inspect(
  executor: LockExecutor,
  options: InspectOptions = {},
): Promise<Inspection> {
  assertLockExecutor(executor);
  const o = checkOptions(options);
  const { names, schema } = o;
  return executor.transaction(async ({ query }) => {
    const tables = tablesStatement(o.schemaName);
    const [present] = await query(tables.text, tables.params);
    const leaseRows: Row[] = present?.leases ? await query(leasesStatement(schema)) : [];
    let jobRows: Row[] = [];
    let runRows: Row[] = [];
    if (present?.runs) {
      const jobs = jobsStatement(schema, o.jobWindow);
      jobRows = await query(jobs.text, jobs.params);
      if (o.recentRuns > 0 || o.runsPerJob > 0) {
        const latest = latestRunsStatement(schema, o.runsPerJob, o.recentRuns);
        runRows = await query(latest.text, latest.params);
      }
    }
    for (const l of leaseRows) names.add(l.namespace as string, l.job_key as string);
    for (const j of jobRows) names.add(SCHEDULER_NAMESPACE, j.job as string);
    const lockRows = await query(ADVISORY_LOCKS);
    const [capacityRow] = await query(LOCK_TABLE_CAPACITY);
    const slots = Number(capacityRow?.slots ?? 0);
    const used = Number(capacityRow?.used ?? 0);
    const recentByJob = new Map<string, InspectedRun[]>();
    const recentRuns: InspectedRun[] = [];
    for (const r of runRows) {
      const run = runOf(r);
      if (Number(r.job_rank) <= o.runsPerJob) {
        const list = recentByJob.get(run.job) ?? [];
        list.push(run);
        recentByJob.set(run.job, list);
      }
      if (Number(r.overall_rank) <= o.recentRuns) recentRuns.push(run);
    }
    return {
      locks: lockRows.map((r) => ({
        ...sampledLockOf(r, names),
        state: (r.state as string | null) ?? null,
        transactionAgeMs: num(r.transaction_age_ms),
        waitingMs: num(r.waiting_ms),
        blockedBy: ((r.blocked_by as unknown[] | null) ?? []).map(Number),
      })),
      capacity: {
        slots,
        used,
        advisory: Number(capacityRow?.advisory ?? 0),
        ratio: slots > 0 ? used / slots : 0,
        warning: slots > 0 && used / slots > o.warnAbove,
      },
      leases: leaseRows.map((l) => ({
        namespace: l.namespace as string,
        jobKey: l.job_key as string,
        token: BigInt(l.token as string),
        status: l.status as string,
        owner: (l.owner as string | null) ?? null,
        held: l.held === true,
        expiresAt: date(l.expires_at),
        claimedAt: date(l.claimed_at),
        finishedAt: date(l.finished_at),
        attempts: Number(l.attempts),
        lastError: (l.last_error as string | null) ?? null,
      })),
      jobs: jobRows.map((j) => {
        const succeeded = Number(j.succeeded);
        const failed = Number(j.failed);
        const abandoned = Number(j.abandoned);
        const running = Number(j.running);
        return {
          job: j.job as string,
          lastTick: date(j.last_tick),
          lastSuccess: date(j.last_success),
          ran: succeeded + failed + abandoned + running,
          succeeded,
          failed,
          missed: Number(j.missed),
          skippedOverlap: Number(j.skipped_overlap),
          abandoned,
          running,
          total: Number(j.total),
          window: o.jobWindow,
          recent: recentByJob.get(j.job as string) ?? [],
        };
      }),
      recentRuns,
    };
  });
}

/** One advisory lock seen by {@link sampleLocks}. */
export interface SampledLock {
  readonly pid: number;
  readonly key: LockKey;
  /** The names the key was made from, when lockkit knows them. */
  readonly names: { readonly namespace: string; readonly jobKey: string } | undefined;
  readonly mode: 'exclusive' | 'shared';
  readonly granted: boolean;
  readonly applicationName: string | null;
  readonly clientAddress: string | null;
  readonly user: string | null;
}

/** What {@link sampleLocks} saw, and when. */
export interface LockSample {
  readonly at: Date;
  readonly locks: readonly SampledLock[];
}

/**
 * One cheap look at the advisory locks held or awaited in the current database, with each
 * holder's `application_name`: for sampling several times a second, since a transaction-scoped
 * lock often lives for milliseconds (the dashboard keeps what it saw over the last seconds).
 * Decodes keys with `names` only (pass the registry an {@link inspect} call filled). One
 * statement; no blocking graph, no ledger.
 */
export async function sampleLocks(
  executor: LockExecutor,
  options: { readonly names?: KeyNames } = {},
): Promise<LockSample> {
  assertLockExecutor(executor);
  if (options.names !== undefined && !(options.names instanceof KeyNames)) {
    throw new LockkitError('OPTION_INVALID', 'names must be a KeyNames (new KeyNames().add(…)).');
  }
  const names = options.names ?? new KeyNames();
  const rows = await executor.transaction(({ query }) => query(ADVISORY_LOCK_SAMPLE));
  return {
    at: new Date(),
    locks: rows.map((r) => sampledLockOf(r, names)),
  };
}
