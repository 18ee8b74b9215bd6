/**
 * Seeing what is locked: advisory locks decoded back to names, who waits for whom, how full the
 * lock table is, and what leases and the scheduler ledger say.
 *
 * @packageDocumentation
 */
import { assertLockExecutor, type LockExecutor, type Row } from './executor.js';
import { LockKey } from './keys.js';
import { SCHEDULER_NAMESPACE } from './scheduler-namespace.js';
import { quoteIdentifier } from './sql/identifiers.js';
import {
  ADVISORY_LOCKS,
  jobsStatement,
  LOCK_TABLE_CAPACITY,
  leasesStatement,
  recentRunsStatement,
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

/** A scheduled job's ledger summary. */
export interface InspectedJob {
  readonly job: string;
  readonly lastTick: Date | null;
  readonly lastSuccess: Date | null;
  readonly failed: number;
  readonly missed: number;
  readonly skippedOverlap: number;
  readonly abandoned: number;
  readonly running: number;
  readonly total: number;
}

/** One ledger row. */
export interface InspectedRun {
  readonly job: string;
  readonly tick: Date;
  readonly status: string;
  readonly owner: string | null;
  readonly attempt: number;
  readonly token: bigint | null;
  readonly startedAt: Date | null;
  readonly finishedAt: Date | null;
  readonly error: string | null;
}

/** Everything {@link inspect} saw. */
export interface Inspection {
  readonly locks: readonly InspectedLock[];
  readonly capacity: LockTableCapacity;
  /** Empty when the lease table does not exist (no `migrate()` yet). */
  readonly leases: readonly InspectedLease[];
  readonly jobs: readonly InspectedJob[];
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
  /** How many recent ledger rows to return (default 50). */
  readonly recentRuns?: number;
}

const num = (v: unknown): number | null => (v === null || v === undefined ? null : Number(v));
const date = (v: unknown): Date | null =>
  v === null || v === undefined ? null : new Date(v as string);

/**
 * Reads, in one transaction, every advisory lock in the current database (decoded to names where
 * lockkit can: registered names, every lease, every scheduled job), who blocks whom, the lock
 * table's headroom, and the lease and ledger tables.
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
  const schemaName = options.schema ?? 'lockkit';
  const schema = quoteIdentifier(schemaName);
  const warnAbove = options.warnAbove ?? 0.8;
  const names = options.names ?? new KeyNames();
  return executor.transaction(async ({ query }) => {
    const tables = tablesStatement(schemaName);
    const [present] = await query(tables.text, tables.params);
    const leaseRows: Row[] = present?.leases ? await query(leasesStatement(schema)) : [];
    const jobRows: Row[] = present?.runs ? await query(jobsStatement(schema)) : [];
    const recent = recentRunsStatement(schema, options.recentRuns ?? 50);
    const runRows: Row[] = present?.runs ? await query(recent.text, recent.params) : [];
    for (const l of leaseRows) names.add(l.namespace as string, l.job_key as string);
    for (const j of jobRows) names.add(SCHEDULER_NAMESPACE, j.job as string);
    const lockRows = await query(ADVISORY_LOCKS);
    const [capacityRow] = await query(LOCK_TABLE_CAPACITY);
    const slots = Number(capacityRow?.slots ?? 0);
    const used = Number(capacityRow?.used ?? 0);
    return {
      locks: lockRows.map((r) => {
        const key = LockKey.fromPgLocks({
          classid: r.classid as string,
          objid: r.objid as string,
          objsubid: r.objsubid as number,
        });
        return {
          pid: Number(r.pid),
          key,
          names: names.lookup(key),
          mode: r.mode === 'ShareLock' ? ('shared' as const) : ('exclusive' as const),
          granted: r.granted === true,
          applicationName: (r.application_name as string | null) ?? null,
          clientAddress: (r.client_addr as string | null) ?? null,
          user: (r.user_name as string | null) ?? null,
          state: (r.state as string | null) ?? null,
          transactionAgeMs: num(r.transaction_age_ms),
          waitingMs: num(r.waiting_ms),
          blockedBy: ((r.blocked_by as unknown[] | null) ?? []).map(Number),
        };
      }),
      capacity: {
        slots,
        used,
        advisory: Number(capacityRow?.advisory ?? 0),
        ratio: slots > 0 ? used / slots : 0,
        warning: slots > 0 && used / slots > warnAbove,
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
      jobs: jobRows.map((j) => ({
        job: j.job as string,
        lastTick: date(j.last_tick),
        lastSuccess: date(j.last_success),
        failed: Number(j.failed),
        missed: Number(j.missed),
        skippedOverlap: Number(j.skipped_overlap),
        abandoned: Number(j.abandoned),
        running: Number(j.running),
        total: Number(j.total),
      })),
      recentRuns: runRows.map((r) => ({
        job: r.job as string,
        tick: new Date(r.tick as string),
        status: r.status as string,
        owner: (r.owner as string | null) ?? null,
        attempt: Number(r.attempt),
        token: r.token === null || r.token === undefined ? null : BigInt(r.token as string),
        startedAt: date(r.started_at),
        finishedAt: date(r.finished_at),
        error: (r.error as string | null) ?? null,
      })),
    };
  });
}
