/**
 * The scheduler's ledger protocol: intent-level operations on the rows that make each scheduled
 * tick run exactly once — look a tick up, claim it, finish it, give it back, queue it, record it
 * skipped or missed, find the holes catch-up must judge, find the next PENDING tick that is due.
 * Every statement is in `sql/scheduler.ts`; records that concern many ticks are one statement
 * each, so that a whole tick's records can be made at once.
 *
 * Row lifecycle: a tick is claimed RUNNING (attempt n), then ends SUCCEEDED, FAILED (no attempts
 * left) or PENDING with a `retry_at` (a retry). A tick that overlaps a running one is recorded
 * SKIPPED_OVERLAP, or queued PENDING; a tick nobody ran is recorded MISSED or run by catch-up; a
 * tick whose run was stopped, or whose lease-mode runner died, is given back PENDING (that attempt
 * not counted). A PENDING row whose `retry_at` has come is run by whichever node gets to it first.
 *
 * @packageDocumentation
 */
import type { CronSchedule } from './cron-schedule.js';
import type { QueryFn } from './executor.js';
import { type LockKey, sha256 } from './keys.js';
import { refuseInRecovery } from './lock-engine.js';
import type { Statement } from './sql/locks.js';
import {
  claimTickStatement,
  conflictingRegistrationsStatement,
  conflictingSchedulesStatement,
  deregisterSchedulesStatement,
  finishTickStatement,
  giveBackAbandonedStatement,
  giveBackClaimStatement,
  heartbeatSchedulesStatement,
  type LedgerScope,
  leaseHeldStatement,
  liveSchedulesStatement,
  nextDueStatement,
  nextPendingStatement,
  owedTicksStatement,
  PRUNED,
  pendingTicksStatement,
  pruneStatement,
  queueTickStatement,
  type RunRecord,
  ranAfterStatement,
  recentTicksStatement,
  recordTicksStatement,
  registerSchedulesStatement,
  tickJudgeStatement,
  tickStateStatement,
} from './sql/scheduler.js';

export type { RunRecord };

/** The most holes one catch-up judges: the newest ones, found backward from the horizon. */
export const MAX_CATCH_UP = 1000;

/**
 * How many of a job's latest ledger rows at or before the grace horizon catch-up anchors on: the
 * oldest of them written under the current schedule and neither SKIPPED_OVERLAP nor PENDING. A
 * tick nobody ran stays in view until this many later ticks are run or recorded otherwise than
 * skipped (or {@link CATCH_UP_ROWS} later rows exist, whatever they are).
 */
export const CATCH_UP_WINDOW = 10;

/**
 * The most ledger rows one catch-up reads: those of the holes it may judge and of the
 * {@link CATCH_UP_WINDOW} it anchors on. A transaction-mode run that outlasts more of its own
 * ticks than this (each recorded SKIPPED_OVERLAP or queued) and then dies leaves its tick out of
 * view.
 */
export const CATCH_UP_ROWS = MAX_CATCH_UP + CATCH_UP_WINDOW;

/** The note of a tick given back PENDING after stop() aborted its run. */
const GIVEN_BACK = 'given back: the scheduler stopped';

/** The note of a lease-mode tick given back PENDING after its fenced write lost its connection. */
const GIVEN_BACK_INTERRUPTED =
  'given back: the database connection was lost under its fenced write (not the job failing)';

/** The note of a tick catch-up chose to run, held PENDING for it until it runs. */
const HELD_FOR_CATCH_UP = 'held for catch-up';
/** The note of a tick held for a job's new owner: the one before it went without deciding it. */
const OWED = 'owed: its owner left before deciding it';

/** How a registration stays live without a heartbeat (doctor and conflict checks). */
export const REGISTRATION_LIVE_MS = 180_000;

/** What the ledger says about one tick. */
export type TickState =
  /** No row: nobody claimed or judged it yet. */
  | { readonly kind: 'free' }
  /**
   * PENDING and due: a retry, a queued tick, a tick given back or held for catch-up, to claim
   * now. `catchUp`: catch-up chose it (nobody ran it when it was due).
   */
  | { readonly kind: 'due'; readonly catchUp: boolean }
  /** PENDING, not yet due (a retry waiting for its delay). */
  | { readonly kind: 'waiting' }
  /** RUNNING, by a live runner. */
  | { readonly kind: 'running' }
  /** RUNNING in lease mode under a lease that is no longer live: its runner is gone. */
  | { readonly kind: 'runner-gone' }
  /**
   * RUNNING with no lease token, seen committed by another transaction: a transaction-mode claim
   * commits only together with its finish, so this one was committed by its own handler (a COMMIT
   * of its own, `LOCK_NOT_HELD`), and the record of that failure never came. Its work may be
   * committed: to record FAILED, never to run again.
   */
  | { readonly kind: 'self-committed' }
  /** SUCCEEDED, FAILED, SKIPPED_OVERLAP, MISSED or ABANDONED: nothing more to do. */
  | { readonly kind: 'settled'; readonly status: string }
  /**
   * No row, older than what pruning keeps, with rows after it and none before: it may have run and
   * had its row pruned. Done: nothing tells it from a tick that ran.
   */
  | { readonly kind: 'pruned' };

/** A job as the ledger knows it: its name and the hash of its schedule. */
export interface LedgerJob {
  readonly name: string;
  /** {@link scheduleHash} of the job's cron expression and time zone. */
  readonly hash: string;
}

/** A live registration of a job's schedule. */
export interface Registration {
  readonly owner: string;
  readonly cron: string;
  readonly timezone: string;
  readonly hash: string;
}

/**
 * The JSON text of jobs' registrations that {@link Ledger.registerMany} takes: an array of
 * `[job, cron, timezone, hash]`, one per row `from` ≤ row < `to`, as `row(i)` writes them into
 * `into` (reused for each, so that no object is made a job). One text for both statements. A
 * scheduler sends 10,000 jobs' worth at start, and whatever a statement's parameters reach lives
 * on, as garbage V8 still copies, while a dead promoted frame of the statement refers to it: named
 * fields, a text of the names besides, and an object and strings a job for it made the start's
 * young-generation survivors twice as many (docs/performance.md).
 */
export function registrationRows(
  from: number,
  to: number,
  row: (index: number, into: RegistrationRow) => void,
): string {
  const into: RegistrationRow = { job: '', cron: '', timezone: '', hash: '' };
  const parts: string[] = [];
  for (let i = from; i < to; i++) {
    row(i, into);
    parts.push(JSON.stringify([into.job, into.cron, into.timezone, into.hash]));
  }
  return `[${parts.join(',')}]`;
}

/** One job's registration, as {@link registrationRows} asks for it. */
export interface RegistrationRow {
  job: string;
  cron: string;
  timezone: string;
  hash: string;
}

/**
 * The hash stored with every ledger row: which schedule (cron expression, time zone, and
 * `domAndDow` when set) the tick belongs to. Catch-up judges only ticks of the job's current schedule.
 */
export function scheduleHash(cron: string, timezone: string, domAndDow = false): string {
  // Flat 16 characters, not a slice keeping the whole 64-character digest alive with it.
  return scheduleDigest(cron, timezone, domAndDow).toString('hex', 0, 8);
}

function scheduleDigest(cron: string, timezone: string, domAndDow: boolean): Buffer {
  return sha256(`${timezone}\n${cron}${domAndDow ? '\ndom-and-dow' : ''}`);
}

/**
 * {@link scheduleHash} as two 32-bit words written into `row` at `at`: a scheduler's table of
 * schedules keeps these, not a string per schedule; {@link scheduleHashText} makes the string.
 */
export function writeScheduleHash(
  cron: string,
  timezone: string,
  domAndDow: boolean,
  row: Int32Array,
  at: number,
): void {
  const digest = scheduleDigest(cron, timezone, domAndDow);
  row[at] = digest.readInt32BE(0);
  row[at + 1] = digest.readInt32BE(4);
}

/** The {@link scheduleHash} whose words {@link writeScheduleHash} wrote into `row` at `at`. */
export function scheduleHashText(row: Int32Array, at: number): string {
  const hex = (word: number) => ((word as number) >>> 0).toString(16).padStart(8, '0');
  return hex(row[at] as number) + hex(row[at + 1] as number);
}

const rowsOf = async (query: QueryFn, s: Statement) => query(s.text, s.params);

/** The ledger of one scheduler: its schema, namespace and owner. */
export class Ledger {
  constructor(
    private readonly scope: LedgerScope,
    private readonly owner: string,
    /** The lease namespace of the scheduler's lease-mode jobs. */
    private readonly leaseNamespace: string,
  ) {}

  /**
   * What the ledger says about `tick` of `job`, by the scheduler's clock `now`. With
   * `prunedBeforeMs` (how old a row this node's pruning may delete; null: it deletes none), a tick
   * whose row pruning may have deleted is `pruned`, not free.
   */
  async state(
    query: QueryFn,
    job: LedgerJob,
    tick: Date,
    now: Date,
    prunedBeforeMs: number | null,
  ): Promise<TickState> {
    const s = tickStateStatement(
      this.scope,
      this.leaseNamespace,
      job.name,
      tick,
      now,
      prunedBeforeMs,
    );
    const [row] = await rowsOf(query, s);
    if (!row) return { kind: 'free' };
    const status = String(row.status);
    if (status === PRUNED) return { kind: 'pruned' };
    if (status === 'PENDING')
      return row.due === true
        ? { kind: 'due', catchUp: row.error === HELD_FOR_CATCH_UP && Number(row.attempt) === 0 }
        : { kind: 'waiting' };
    if (status === 'RUNNING') {
      if (row.runner_gone === true) return { kind: 'runner-gone' };
      return row.token === null ? { kind: 'self-committed' } : { kind: 'running' };
    }
    return { kind: 'settled', status };
  }

  /**
   * Asked after a wait for the job's lock timed out (see {@link tickJudgeStatement}): whether the
   * tick's lock was free (then taken until the end of the transaction), and, if so, whether a
   * transaction holds the job's lock together with another tick's lock — a run of another tick,
   * the only proof of an overlap.
   */
  async judge(
    query: QueryFn,
    jobKey: LockKey,
    tickKey: LockKey,
  ): Promise<{ readonly tickFree: boolean; readonly anotherTickRuns: boolean }> {
    const [row] = await rowsOf(query, tickJudgeStatement(jobKey, tickKey));
    if (row) refuseInRecovery(row, `lock ${jobKey}`);
    return { tickFree: row?.tick_free === true, anotherTickRuns: row?.another_tick_runs === true };
  }

  /** Claims `tick` (free, or PENDING and due): its attempt number, or undefined when not ours. */
  async claim(
    query: QueryFn,
    job: LedgerJob,
    tick: Date,
    token: bigint | null,
    now: Date,
  ): Promise<number | undefined> {
    const s = claimTickStatement(this.scope, job.name, tick, {
      owner: this.owner,
      token,
      hash: job.hash,
      now,
    });
    const [row] = await rowsOf(query, s);
    return row ? Number(row.attempt) : undefined;
  }

  /** The statement that ends a claimed run (lease mode records it with the lease's own record). */
  finishStatement(job: LedgerJob, tick: Date, token: bigint | null, record: RunRecord): Statement {
    return finishTickStatement(this.scope, job.name, tick, token, record);
  }

  /** Ends a claimed run: whether its RUNNING row (under `token`) was there to end. */
  async finish(
    query: QueryFn,
    job: LedgerJob,
    tick: Date,
    token: bigint | null,
    record: RunRecord,
  ): Promise<boolean> {
    return (await rowsOf(query, this.finishStatement(job, tick, token, record))).length > 0;
  }

  /** Gives back a tick whose run stop() aborted: due again at once, the attempt not counted. */
  async giveBack(
    query: QueryFn,
    job: LedgerJob,
    tick: Date,
    token: bigint | null,
    now: Date,
  ): Promise<void> {
    const s =
      token === null
        ? pendingTicksStatement(this.scope, job.name, [tick], job.hash, now, GIVEN_BACK)
        : giveBackClaimStatement(this.scope, job.name, tick, token, now, GIVEN_BACK, false);
    await rowsOf(query, s);
  }

  /**
   * The statement of {@link Ledger.giveBack} in lease mode, recorded with the lease's end: `why`
   * the scheduler stopped, or the database went away under the run's fenced write.
   */
  giveBackStatement(
    job: LedgerJob,
    tick: Date,
    token: bigint,
    now: Date,
    why: 'stopped' | 'interrupted',
  ): Statement {
    const note = why === 'stopped' ? GIVEN_BACK : GIVEN_BACK_INTERRUPTED;
    // An interrupted run counts as an attempt: give-backs stay bounded (see the scheduler).
    return giveBackClaimStatement(this.scope, job.name, tick, token, now, note, why !== 'stopped');
  }

  /** Gives back the ticks of lease-mode runs that did not finish under their token. */
  async giveBackAbandoned(
    query: QueryFn,
    job: LedgerJob,
    liveToken: bigint,
    now: Date,
  ): Promise<void> {
    await rowsOf(query, giveBackAbandonedStatement(this.scope, job.name, liveToken, now));
  }

  /** Records `tick` SKIPPED_OVERLAP unless it has a row: whether it was recorded. */
  async recordSkipped(query: QueryFn, job: LedgerJob, tick: Date): Promise<boolean> {
    const s = recordTicksStatement(
      this.scope,
      job.name,
      [tick],
      'SKIPPED_OVERLAP',
      this.owner,
      job.hash,
    );
    return (await rowsOf(query, s)).length > 0;
  }

  /**
   * Holds the ticks catch-up chose to run: PENDING and due at once, so that nobody judges them
   * again (as holes, missed or to run) before they run. Those held (others had rows).
   */
  async holdForCatchUp(
    query: QueryFn,
    job: LedgerJob,
    ticks: readonly Date[],
    now: Date,
  ): Promise<Date[]> {
    return this.holdPending(query, job, ticks, now, HELD_FOR_CATCH_UP);
  }

  /**
   * Holds ticks of `job` that its owner left undecided when it went (owned distribution): PENDING
   * and due at once, unless the tick has a row already (it ran, or someone holds it) or its lock
   * (`key`, see {@link owedTicksStatement}) is held: someone is deciding or running it. `held`:
   * those held; `busy`: those whose lock was held (the caller asks again later). Oldest first.
   */
  async holdOwed(
    query: QueryFn,
    job: LedgerJob,
    ticks: readonly { readonly tick: Date; readonly key: LockKey }[],
    now: Date,
  ): Promise<{ readonly held: Date[]; readonly busy: Date[] }> {
    if (ticks.length === 0) return { held: [], busy: [] };
    const s = owedTicksStatement(this.scope, job.name, ticks, job.hash, now, OWED);
    const rows = (await rowsOf(query, s))
      .map((r) => ({ tick: new Date(r.tick as string), held: r.held === true }))
      .sort((a, b) => a.tick.getTime() - b.tick.getTime());
    return {
      held: rows.filter((r) => r.held).map((r) => r.tick),
      busy: rows.filter((r) => !r.held).map((r) => r.tick),
    };
  }

  /** `ticks` PENDING and due at once, with `note`, where they have no row: those held, oldest first. */
  private async holdPending(
    query: QueryFn,
    job: LedgerJob,
    ticks: readonly Date[],
    now: Date,
    note: string,
  ): Promise<Date[]> {
    if (ticks.length === 0) return [];
    const s = pendingTicksStatement(this.scope, job.name, ticks, job.hash, now, note);
    return (await rowsOf(query, s))
      .map((r) => new Date(r.tick as string))
      .sort((a, b) => a.getTime() - b.getTime());
  }

  /** Records `ticks` MISSED, in one statement: those recorded (others had rows). */
  async recordMissed(query: QueryFn, job: LedgerJob, ticks: readonly Date[]): Promise<Date[]> {
    if (ticks.length === 0) return [];
    const s = recordTicksStatement(this.scope, job.name, ticks, 'MISSED', this.owner, job.hash);
    return (await rowsOf(query, s))
      .map((r) => new Date(r.tick as string))
      .sort((a, b) => a.getTime() - b.getTime());
  }

  /**
   * Queues `tick` PENDING, due at once (from its own time): `'queued'`, `'exists'` (it has a row already) or `'full'`
   * (the job has `limit` PENDING ticks; the tick is then recorded SKIPPED_OVERLAP).
   */
  async queue(
    query: QueryFn,
    job: LedgerJob,
    tick: Date,
    now: Date,
    limit: number,
  ): Promise<'queued' | 'exists' | 'full'> {
    const s = queueTickStatement(this.scope, job.name, tick, this.owner, job.hash, now, limit);
    if ((await rowsOf(query, s)).length > 0) return 'queued';
    return (await this.recordSkipped(query, job, tick)) ? 'full' : 'exists';
  }

  /**
   * `holes`: the ticks of `cron` at or before `horizon` that have no row, newest first (at most
   * {@link MAX_CATCH_UP}), found backward from the horizon down to the anchor: the oldest of the
   * job's latest {@link CATCH_UP_WINDOW} rows written under its current schedule and neither
   * SKIPPED_OVERLAP nor PENDING (see `recentTicksStatement`). None when no row of the current schedule
   * exists: a new job, or a schedule just changed, has nothing settled to catch up from;
   * ticks of another schedule are neither missed nor run. `selfCommitted`: those of the latest
   * rows read that a handler's own COMMIT left RUNNING, unrecorded (see `recentTicksStatement`);
   * they are not holes.
   */
  async findHoles(
    query: QueryFn,
    job: LedgerJob,
    cron: Pick<CronSchedule, 'previousRuns'>,
    horizon: Date,
  ): Promise<{ readonly holes: Date[]; readonly selfCommitted: Date[] }> {
    const s = recentTicksStatement(
      this.scope,
      job.name,
      horizon,
      job.hash,
      CATCH_UP_WINDOW,
      CATCH_UP_ROWS,
    );
    const rows = await rowsOf(query, s);
    const settled = new Set(rows.map((r) => new Date(r.tick as string).getTime()));
    const selfCommitted = rows
      .filter((r) => r.self_committed === true)
      .map((r) => new Date(r.tick as string));
    // Every row from the anchor to the horizon was read. With no anchoring row among the latest
    // CATCH_UP_ROWS (a run that outlasted that many of its ticks), the oldest current one read.
    const anchoring = rows.filter((r) => r.anchoring === true);
    const anchors = (anchoring.length > 0 ? anchoring : rows.filter((r) => r.current === true)).map(
      (r) => new Date(r.tick as string).getTime(),
    );
    if (anchors.length === 0) return { holes: [], selfCommitted };
    const anchor = Math.min(...anchors);
    const holes: Date[] = [];
    // croner lists runs strictly before its reference: start just after the horizon.
    let reference = new Date(horizon.getTime() + 1);
    while (holes.length < MAX_CATCH_UP) {
      const batch = cron.previousRuns(Math.min(100, MAX_CATCH_UP - holes.length), reference);
      if (batch.length === 0) break;
      let done = false;
      for (const t of batch) {
        const ms = t.getTime();
        if (ms <= anchor) {
          done = true;
          break;
        }
        if (ms <= horizon.getTime() && !settled.has(ms)) holes.push(t);
      }
      const last = batch.at(-1);
      if (done || !last || last.getTime() >= reference.getTime()) break;
      reference = last;
    }
    return { holes, selfCommitted };
  }

  /**
   * Whether a tick after `tick` has run, is running, or waits in the ledger to run: a hole older
   * than such a tick is behind the job's latest run.
   */
  async ranAfter(query: QueryFn, job: LedgerJob, tick: Date): Promise<boolean> {
    const [row] = await rowsOf(query, ranAfterStatement(this.scope, job.name, tick));
    return row?.ran === true;
  }

  /** The job's oldest PENDING tick that is due at `now`, if any. */
  async nextDue(query: QueryFn, job: LedgerJob, now: Date): Promise<Date | undefined> {
    const [row] = await rowsOf(query, nextDueStatement(this.scope, job.name, now));
    return row ? new Date(row.tick as string) : undefined;
  }

  /**
   * What a drain at `now` does next: the job's oldest PENDING tick that is due (`due` true), else
   * the PENDING tick due soonest (`due` false, due at `retryAt`), else undefined.
   */
  async nextPending(
    query: QueryFn,
    job: LedgerJob,
    now: Date,
  ): Promise<{ readonly tick: Date; readonly due: boolean; readonly retryAt: Date } | undefined> {
    const [row] = await rowsOf(query, nextPendingStatement(this.scope, job.name, now));
    if (!row) return undefined;
    return {
      tick: new Date(row.tick as string),
      due: row.due === true,
      retryAt: new Date(row.retry_at as string),
    };
  }

  /** Whether a lease-mode job's lease is held by a live run (which runs what is due when it ends). */
  async leaseHeld(query: QueryFn, job: LedgerJob): Promise<boolean> {
    const [row] = await rowsOf(
      query,
      leaseHeldStatement(this.scope.schema, this.leaseNamespace, job.name),
    );
    return row?.held === true;
  }

  /** Deletes the job's settled rows older than `retentionMs` (keeping its latest). */
  async prune(query: QueryFn, job: LedgerJob, retentionMs: number): Promise<void> {
    await rowsOf(query, pruneStatement(this.scope, job.name, retentionMs));
  }

  /**
   * Registers this instance's schedules of many jobs (no job twice) in two statements, whatever
   * their number; returns, by job name, the live registrations of those of them that live
   * instances registered under more than one schedule (a job with one schedule is not in the
   * map). `rows` is their JSON, made by {@link registrationRows}; the caller bounds the batch: it
   * is one parameter.
   */
  async registerMany(query: QueryFn, rows: string): Promise<Map<string, Registration[]>> {
    await rowsOf(query, registerSchedulesStatement(this.scope, this.owner, rows));
    const conflicting = await rowsOf(
      query,
      conflictingRegistrationsStatement(this.scope, rows, REGISTRATION_LIVE_MS),
    );
    const byJob = new Map<string, Registration[]>();
    for (const r of conflicting) {
      const job = String(r.job);
      let live = byJob.get(job);
      if (live === undefined) {
        live = [];
        byJob.set(job, live);
      }
      live.push({
        owner: String(r.owner),
        cron: String(r.cron),
        timezone: String(r.timezone),
        hash: String(r.schedule_hash),
      });
    }
    return byJob;
  }

  /** Every live registration of `job`. */
  async registrations(query: QueryFn, job: LedgerJob): Promise<Registration[]> {
    const rows = await rowsOf(
      query,
      liveSchedulesStatement(this.scope, job.name, REGISTRATION_LIVE_MS),
    );
    return rows.map((r) => ({
      owner: String(r.owner),
      cron: String(r.cron),
      timezone: String(r.timezone),
      hash: String(r.schedule_hash),
    }));
  }

  /** Names of jobs in this namespace that live instances registered under different schedules. */
  async conflictedJobs(query: QueryFn): Promise<Set<string>> {
    const s = conflictingSchedulesStatement(
      this.scope.schema,
      REGISTRATION_LIVE_MS,
      this.scope.namespace,
    );
    return new Set((await rowsOf(query, s)).map((r) => String(r.job)));
  }

  /** Keeps this instance's registrations live. */
  async heartbeat(query: QueryFn): Promise<void> {
    await rowsOf(query, heartbeatSchedulesStatement(this.scope, this.owner));
  }

  /** Removes this instance's registrations. */
  async deregister(query: QueryFn): Promise<void> {
    await rowsOf(query, deregisterSchedulesStatement(this.scope, this.owner));
  }
}
