/**
 * The distributed cron scheduler: every instance registers the same jobs, and each scheduled tick
 * runs on exactly one of them, whatever their clocks say.
 *
 * Each run is keyed by (job, scheduled tick) in a ledger whose primary key allows one row per
 * pair. A node that fires a tick waits (briefly) for the job's advisory lock, then looks the tick
 * up in the ledger: a late node finds it taken and skips; a node whose colleague died mid-run
 * gets the lock when that transaction rolls back and runs the tick itself.
 *
 * @packageDocumentation
 */
import { randomUUID } from 'node:crypto';
import { setMaxListeners } from 'node:events';
import { hostname } from 'node:os';
import { Cron } from 'croner';
import { LeaseLostError, LockkitError, LockTimeoutError } from './errors.js';
import type { QueryFn, Row } from './executor.js';
import { LockKey } from './keys.js';
import {
  type ClaimedLease,
  claimLease,
  holdLease,
  type LeaseContext,
  type LeaseOptions,
  leaseSettings,
} from './lease.js';
import type { JobResult, LockClient } from './lock.js';
import { SCHEDULER_NAMESPACE } from './scheduler-namespace.js';
import { quoteIdentifier } from './sql/identifiers.js';
import { fenceStatement } from './sql/leases.js';
import { inlinePrepareStatement, type Statement } from './sql/locks.js';
import {
  abandonStatement,
  claimTickStatement,
  finishTickStatement,
  pruneStatement,
  RELEASE_SAVEPOINT,
  ROLLBACK_TO_SAVEPOINT,
  recentTicksStatement,
  recordTickStatement,
  SAVEPOINT,
  tickStatement,
} from './sql/scheduler.js';

export { SCHEDULER_NAMESPACE };

/** What happens to a tick that fires while the job's previous run is still going. */
export type OverlapPolicy = 'skip' | 'queue';

/**
 * What happens to ticks nobody ran (every node down, a deploy): `'skip'` records them MISSED;
 * `'latest'` runs the most recent one once and records the rest; `{ withinMs }` runs those
 * younger than the window and records the rest.
 */
export type CatchUpPolicy = 'skip' | 'latest' | { readonly withinMs: number };

/** Options of one job. */
export interface JobOptions {
  /** `'transaction'` (default): the run holds the job's transaction lock — for short jobs. `'lease'`: a lease — for long ones. */
  readonly mode?: 'transaction' | 'lease';
  /** IANA time zone the cron expression is read in (default: UTC). */
  readonly timezone?: string;
  /** Default `'skip'` (recorded SKIPPED_OVERLAP); `'queue'` waits for the running one to end. */
  readonly overlap?: OverlapPolicy;
  /** Default `'skip'`. */
  readonly catchUp?: CatchUpPolicy;
  /** Extra attempts for a failed tick, each recorded with its attempt number. Default 0. */
  readonly retries?: number;
  /** Delay before a retry, in ms. Default 1000. */
  readonly retryDelayMs?: number;
  /** Longest a run may take: its signal aborts then (and, in transaction mode, statement_timeout). */
  readonly timeoutMs?: number;
  /** Fire each tick after a random delay of up to this many ms, to spread load. Default 0. */
  readonly jitterMs?: number;
  /** Longest a node waits for the job's lock before treating the tick as overlapping. Default 5000. */
  readonly claimTimeoutMs?: number;
  /** Lease settings in lease mode (`ttlMs`, `renewEveryMs`, `safetyMarginMs`). */
  readonly lease?: Pick<LeaseOptions, 'ttlMs' | 'renewEveryMs' | 'safetyMarginMs'>;
  /**
   * With `overlap: 'queue'`: how many ticks of the job may wait in the ledger at once. A tick
   * beyond it is recorded SKIPPED_OVERLAP with a `queue-full` event. Default 100.
   */
  readonly queueLimit?: number;
}

/** What every run is told. */
export interface RunInfo {
  readonly job: string;
  /** The scheduled tick this run is for (not the time it started). */
  readonly tick: Date;
  /** 1 for the first attempt, 2 for the first retry, … */
  readonly attempt: number;
  /** Aborted on connection or lease loss, on `timeoutMs`, and on `stop()`. */
  readonly signal: AbortSignal;
}

/** A run in transaction mode: the job's work joins the claim's transaction. */
export interface TransactionRun<Tx> extends RunInfo {
  readonly mode: 'transaction';
  readonly tx: Tx;
  readonly query: QueryFn;
}

/** A run in lease mode: outside any transaction, holding a lease with a fencing token. */
export interface LeaseRun<Tx> extends RunInfo {
  readonly mode: 'lease';
  readonly lease: LeaseContext<Tx>;
}

/** A job's handler. */
export type JobHandler<Tx> = (run: TransactionRun<Tx> | LeaseRun<Tx>) => Promise<unknown> | unknown;

/** Every outcome the scheduler reports. */
export type SchedulerEvent =
  | {
      readonly type: 'ran';
      readonly job: string;
      readonly tick: Date;
      readonly attempt: number;
      readonly durationMs: number;
    }
  | {
      readonly type: 'failed';
      readonly job: string;
      readonly tick: Date;
      readonly attempt: number;
      readonly error: unknown;
      readonly willRetry: boolean;
    }
  | { readonly type: 'skipped-held'; readonly job: string; readonly tick: Date }
  | { readonly type: 'skipped-done'; readonly job: string; readonly tick: Date }
  | { readonly type: 'missed'; readonly job: string; readonly ticks: readonly Date[] }
  | {
      readonly type: 'lease-lost';
      readonly job: string;
      readonly tick: Date;
      readonly error: LeaseLostError;
    }
  | { readonly type: 'error'; readonly job: string; readonly tick: Date; readonly error: unknown }
  | { readonly type: 'queue-full'; readonly job: string; readonly tick: Date }
  | {
      readonly type: 'schedule-conflict';
      readonly job: string;
      /** Every live registration of the job in this namespace, this instance's included. */
      readonly schedules: readonly ScheduleRegistration[];
    };

/** One instance's registration of a job, as the ledger's schedules table holds it. */
export interface ScheduleRegistration {
  readonly owner: string;
  readonly cron: string;
  readonly timezone: string;
}

/** The type names of {@link SchedulerEvent}. */
export type SchedulerEventType = SchedulerEvent['type'];

/** Every outcome of a scheduled tick (all event types but infrastructure `error`s). */
export const SCHEDULER_OUTCOMES = [
  'ran',
  'failed',
  'skipped-held',
  'skipped-done',
  'missed',
  'lease-lost',
] as const satisfies readonly SchedulerEventType[];

/** Options of a scheduler. */
export interface SchedulerOptions {
  /** Who runs the jobs, stored in the ledger. Default `host:pid:random`. */
  readonly owner?: string;
  /** The clock, in ms since the epoch. Default `Date.now` — tests pass a skewed one. */
  readonly now?: () => number;
  /**
   * Ledger rows older than this are deleted (the latest row of each job is always kept).
   * Default 7 days; 0 keeps everything.
   */
  readonly retentionMs?: number;
  /**
   * A tick younger than this is never declared missed: a node whose clock is late may still be
   * about to run it. Must exceed your largest clock skew. Default 2000.
   */
  readonly catchUpGraceMs?: number;
  /**
   * Scopes job names: schedulers with different namespaces in one schema share neither ledger
   * rows nor locks. Default: none (the scope every scheduler without one shares).
   */
  readonly namespace?: string;
}

interface Job<Tx> {
  readonly name: string;
  readonly key: LockKey;
  readonly cron: Cron;
  readonly handler: JobHandler<Tx>;
  readonly mode: 'transaction' | 'lease';
  readonly overlap: OverlapPolicy;
  readonly catchUp: CatchUpPolicy;
  readonly maxAttempts: number;
  readonly retryDelayMs: number;
  readonly timeoutMs: number | undefined;
  readonly jitterMs: number;
  readonly claimTimeoutMs: number;
  readonly lease: LeaseOptions;
  timer?: NodeJS.Timeout;
  lastTick: number;
}

const MAX_CATCH_UP = 1000;

/**
 * How many of a job's latest settled ledger rows catch-up reads to find holes in: a tick nobody
 * ran stays in view until this many later ticks are older than the grace horizon.
 */
const CATCH_UP_WINDOW = 10;

/** What the claim transaction of a lease-mode tick decided. */
type LeaseClaim =
  | { readonly kind: 'done' }
  | { readonly kind: 'held'; readonly catchUp: Date[] }
  | {
      readonly kind: 'claimed';
      readonly lease: ClaimedLease;
      readonly attempt: number;
      readonly catchUp: Date[];
    };

function count(value: unknown, name: string, min: number, fallback: number): number {
  const v = value ?? fallback;
  if (typeof v !== 'number' || !Number.isInteger(v) || v < min || v > 2_147_483_647) {
    throw new LockkitError(
      'OPTION_INVALID',
      `${name} must be an integer ≥ ${min}, got ${String(v)}.`,
    );
  }
  return v;
}

/** Waits `ms`, or until `signal` aborts; either way its listener is gone afterwards. */
const sleep = (ms: number, signal?: AbortSignal) =>
  new Promise<void>((resolve) => {
    const done = () => {
      clearTimeout(timer);
      signal?.removeEventListener('abort', done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal?.addEventListener('abort', done, { once: true });
  });

/**
 * Runs registered cron jobs so that each scheduled tick runs exactly once across every instance
 * that registers the same jobs. Create with {@link createScheduler}.
 *
 * @example
 * ```ts
 * const scheduler = createScheduler(locks);
 * scheduler.register('invoices', '0 * * * * *', async ({ tx }) => { … });       // every minute
 * scheduler.register('report', '0 0 3 * * *', async ({ lease }) => { … },
 *   { mode: 'lease', timezone: 'Europe/Oslo' });                                  // 03:00 Oslo
 * scheduler.on('failed', (e) => log.error(e));
 * await scheduler.start();
 * process.once('SIGTERM', () => void scheduler.stop({ timeoutMs: 10_000 }));
 * ```
 */
export class Scheduler<Tx> {
  private readonly jobs = new Map<string, Job<Tx>>();
  /** Job name by lock key, to refuse a colliding name in O(1). */
  private readonly jobByKey = new Map<string, string>();
  /**
   * Parsed schedules by time zone and expression. A croner `Cron` holds a table of 10,000 years
   * (~80 KB); jobs on the same schedule share one, so 10,000 hourly jobs do not cost 800 MB.
   */
  private readonly schedules = new Map<string, Cron>();
  private readonly listeners = new Map<SchedulerEventType, Set<(event: never) => void>>();
  private readonly running = new Set<Promise<void>>();
  private readonly stopping = new AbortController();
  private readonly owner: string;
  private readonly now: () => number;
  private readonly retentionMs: number;
  private readonly graceMs: number;
  private readonly schema: string;
  private started = false;
  private pruneTimer: NodeJS.Timeout | undefined;

  /** @internal use {@link createScheduler} */
  constructor(
    private readonly locks: LockClient<Tx, unknown>,
    options: SchedulerOptions = {},
  ) {
    this.schema = quoteIdentifier(locks.schema);
    this.owner = options.owner ?? `${hostname()}:${process.pid}:${randomUUID().slice(0, 8)}`;
    this.now = options.now ?? Date.now;
    // Every job waiting for its lock listens to this one signal: more than ten jobs is normal.
    setMaxListeners(0, this.stopping.signal);
    this.retentionMs = count(options.retentionMs, 'retentionMs', 0, 7 * 24 * 3600 * 1000);
    this.graceMs = count(options.catchUpGraceMs, 'catchUpGraceMs', 0, 2000);
  }

  /**
   * Registers a job. Fails at once on a duplicate name, a name whose lock key collides with another
   * job's, an invalid cron expression (seconds field optional) or time zone, or bad options.
   */
  register(name: string, cron: string, handler: JobHandler<Tx>, options: JobOptions = {}): this {
    const key = LockKey.fromNames(SCHEDULER_NAMESPACE, name);
    if (this.jobs.has(name))
      throw new LockkitError('OPTION_INVALID', `job "${name}" is already registered.`);
    // By the key's numbers alone: two names that hash to one key must collide here.
    const keyId = `${key.pgLocks.classid}/${key.pgLocks.objid}/${key.pgLocks.objsubid}`;
    const colliding = this.jobByKey.get(keyId);
    if (colliding !== undefined) {
      throw new LockkitError(
        'OPTION_INVALID',
        `job names "${name}" and "${colliding}" hash to the same lock key ${key}: rename one.`,
      );
    }
    if (typeof handler !== 'function')
      throw new LockkitError('OPTION_INVALID', 'the handler must be a function.');
    let parsed: Cron;
    if (options.timezone !== undefined && typeof options.timezone !== 'string')
      throw new LockkitError('OPTION_INVALID', `job "${name}": timezone must be an IANA name.`);
    if (typeof cron !== 'string')
      throw new LockkitError(
        'OPTION_INVALID',
        `job "${name}": the cron expression must be a string.`,
      );
    const scheduleId = `${options.timezone ?? ''}\u0000${cron}`;
    try {
      parsed =
        this.schedules.get(scheduleId) ??
        new Cron(cron, {
          paused: true,
          ...(options.timezone !== undefined && { timezone: options.timezone }),
        });
      parsed.nextRun(); // an impossible time zone only shows here
    } catch (cause) {
      throw new LockkitError(
        'OPTION_INVALID',
        `job "${name}": invalid cron expression or time zone "${cron}": ${(cause as Error).message}`,
        { cause },
      );
    }
    const mode = options.mode ?? 'transaction';
    if (mode !== 'transaction' && mode !== 'lease')
      throw new LockkitError('OPTION_INVALID', `mode must be 'transaction' or 'lease'.`);
    const overlap = options.overlap ?? 'skip';
    if (overlap !== 'skip' && overlap !== 'queue')
      throw new LockkitError('OPTION_INVALID', `overlap must be 'skip' or 'queue'.`);
    const catchUp = options.catchUp ?? 'skip';
    if (
      !(
        catchUp === 'skip' ||
        catchUp === 'latest' ||
        (typeof catchUp === 'object' && count(catchUp.withinMs, 'catchUp.withinMs', 1, 1) > 0)
      )
    ) {
      throw new LockkitError('OPTION_INVALID', `catchUp must be 'skip', 'latest' or { withinMs }.`);
    }
    const lease = { ...options.lease, owner: this.owner };
    if (mode === 'lease') leaseSettings(lease); // fail early on bad lease settings
    this.jobs.set(name, {
      name,
      key,
      cron: parsed,
      handler,
      mode,
      overlap,
      catchUp,
      maxAttempts: 1 + count(options.retries, 'retries', 0, 0),
      retryDelayMs: count(options.retryDelayMs, 'retryDelayMs', 0, 1000),
      timeoutMs:
        options.timeoutMs === undefined ? undefined : count(options.timeoutMs, 'timeoutMs', 1, 1),
      jitterMs: count(options.jitterMs, 'jitterMs', 0, 0),
      claimTimeoutMs: count(options.claimTimeoutMs, 'claimTimeoutMs', 1, 5000),
      lease,
      lastTick: 0,
    });
    this.jobByKey.set(keyId, name);
    this.schedules.set(scheduleId, parsed);
    if (this.started) this.schedule(this.jobs.get(name) as Job<Tx>);
    return this;
  }

  /** Listens to one kind of outcome. Listener errors are swallowed. */
  on<E extends SchedulerEventType>(
    type: E,
    listener: (event: Extract<SchedulerEvent, { type: E }>) => void,
  ): this {
    let set = this.listeners.get(type);
    if (!set) {
      set = new Set();
      this.listeners.set(type, set);
    }
    set.add(listener as (event: never) => void);
    return this;
  }

  /** Stops listening. */
  off<E extends SchedulerEventType>(
    type: E,
    listener: (event: Extract<SchedulerEvent, { type: E }>) => void,
  ): this {
    this.listeners.get(type)?.delete(listener as (event: never) => void);
    return this;
  }

  /** Starts firing ticks. The ledger tables must exist (`locks.migrate()`). */
  async start(): Promise<void> {
    if (this.stopping.signal.aborted)
      throw new LockkitError('OPTION_INVALID', 'a stopped scheduler cannot start again.');
    if (this.started) return;
    this.started = true;
    for (const job of this.jobs.values()) this.schedule(job);
    if (this.retentionMs > 0) {
      this.pruneTimer = setInterval(
        () => void this.prune(),
        Math.min(this.retentionMs / 2, 600_000),
      );
      this.pruneTimer.unref();
    }
  }

  /**
   * Stops firing new ticks, aborts the signal of running tasks, and waits up to `timeoutMs`
   * (default 30 s) for them to end. A transaction-mode run that ends by throwing on that signal
   * rolls back entirely, leaving its tick to another node. Resolves with how many runs were still
   * going when the time ran out.
   */
  async stop(
    options: { readonly timeoutMs?: number } = {},
  ): Promise<{ readonly stillRunning: number }> {
    this.stopping.abort(new LockkitError('ABORTED', 'the scheduler is stopping'));
    for (const job of this.jobs.values()) clearTimeout(job.timer);
    clearInterval(this.pruneTimer);
    const all = Promise.allSettled([...this.running]);
    const timeout = new Promise<'timeout'>((resolve) =>
      setTimeout(resolve, options.timeoutMs ?? 30_000, 'timeout').unref(),
    );
    if ((await Promise.race([all, timeout])) === 'timeout')
      return { stillRunning: this.running.size };
    return { stillRunning: 0 };
  }

  /**
   * Runs one tick of a registered job now, exactly as its timer would (claim, catch-up, run,
   * record), and resolves when this node is done with it. For tests and operators: ticks fire
   * without waiting for the clock. Rejects with `OPTION_INVALID` for an unknown job.
   */
  async runTick(name: string, tick: Date): Promise<void> {
    const job = this.jobs.get(name);
    if (!job) throw new LockkitError('OPTION_INVALID', `no job "${name}" is registered.`);
    await this.fire(job, tick);
  }

  private emit(event: SchedulerEvent): void {
    for (const listener of this.listeners.get(event.type) ?? []) {
      try {
        (listener as (e: SchedulerEvent) => void)(event);
      } catch {
        // A listener's failure must not break the scheduler.
      }
    }
  }

  private schedule(job: Job<Tx>): void {
    if (this.stopping.signal.aborted) return;
    const now = this.now();
    const next = job.cron.nextRun(new Date(Math.max(now, job.lastTick)));
    if (!next) return; // a schedule with no future ticks
    const tick = next.getTime();
    const jitter = job.jitterMs > 0 ? Math.floor(Math.random() * job.jitterMs) : 0;
    job.timer = setTimeout(
      () => {
        job.lastTick = tick;
        this.track(this.fire(job, new Date(tick)));
        this.schedule(job);
      },
      Math.max(0, tick - now) + jitter,
    );
  }

  private track(work: Promise<void>): void {
    this.running.add(work);
    void work.finally(() => this.running.delete(work));
  }

  /** One tick on this node, then the catch-up runs it found, then its retry if it failed. */
  private async fire(job: Job<Tx>, tick: Date): Promise<void> {
    try {
      const outcome =
        job.mode === 'transaction'
          ? await this.runInTransaction(job, tick)
          : await this.runInLease(job, tick);
      for (const missedTick of outcome.catchUp) {
        if (this.stopping.signal.aborted) break;
        await this.fire(job, missedTick);
      }
      if (outcome.retry && !this.stopping.signal.aborted) {
        await sleep(job.retryDelayMs, this.stopping.signal);
        if (!this.stopping.signal.aborted) await this.fire(job, tick);
      }
    } catch (error) {
      if (!this.stopping.signal.aborted) this.emit({ type: 'error', job: job.name, tick, error });
    }
  }

  /** The run's signal: the connection's or lease's, the job timeout, and stop(). */
  private runSignal(job: Job<Tx>, base: AbortSignal): AbortSignal {
    const signals = [base, this.stopping.signal];
    if (job.timeoutMs !== undefined) signals.push(AbortSignal.timeout(job.timeoutMs));
    return AbortSignal.any(signals);
  }

  private async query(statement: Statement): Promise<Row[]> {
    return this.locks.executor.transaction(({ query }) => query(statement.text, statement.params));
  }

  /** Records that `tick` is skipped because the previous run still holds the job. */
  private async skipHeld(job: Job<Tx>, tick: Date): Promise<void> {
    const record = recordTickStatement(this.schema, job.name, tick, 'SKIPPED_OVERLAP', this.owner);
    // If the holder is in fact running this very tick, our insert waits on its row: bounded.
    await this.locks.executor
      .transaction(async ({ query }) => {
        await query(inlinePrepareStatement([['statement_timeout', 2000]]));
        return query(record.text, record.params);
      })
      .catch(() => []);
    this.emit({ type: 'skipped-held', job: job.name, tick });
  }

  /**
   * Inside the job's lock: which ticks up to the grace horizon nobody ran, recorded MISSED per
   * policy; returns those to run now. Holes are looked for among the job's latest
   * {@link CATCH_UP_WINDOW} settled ledger rows, not only after the newest row: when every node
   * fails one tick (the server restarting), the next ticks are recorded before that one is old
   * enough to be judged, and it must still be found.
   */
  private async catchUp(job: Job<Tx>, tick: Date, query: QueryFn): Promise<Date[]> {
    const horizon = Math.min(tick.getTime() - 1, this.now() - this.graceMs);
    const recent = recentTicksStatement(this.schema, job.name, new Date(horizon), CATCH_UP_WINDOW);
    const rows = await query(recent.text, recent.params);
    const oldest = rows.at(-1)?.tick;
    if (oldest == null) return []; // a new job: nothing settled was ever due
    const settled = new Set(rows.map((r) => new Date(r.tick as string).getTime()));
    const gap: Date[] = [];
    let cursor: Date | null = job.cron.nextRun(new Date(oldest as string));
    while (cursor && cursor.getTime() <= horizon && gap.length < MAX_CATCH_UP) {
      if (!settled.has(cursor.getTime())) gap.push(cursor);
      cursor = job.cron.nextRun(cursor);
    }
    if (gap.length === 0) return [];
    let run: Date[] = [];
    if (job.catchUp === 'latest') run = gap.slice(-1);
    else if (typeof job.catchUp === 'object') {
      const since = tick.getTime() - job.catchUp.withinMs;
      run = gap.filter((t) => t.getTime() >= since);
    }
    const missed = gap.filter((t) => !run.includes(t));
    const recorded: Date[] = [];
    for (const t of missed) {
      const record = recordTickStatement(this.schema, job.name, t, 'MISSED', this.owner);
      if ((await query(record.text, record.params)).length > 0) recorded.push(t);
    }
    if (recorded.length > 0) this.emit({ type: 'missed', job: job.name, ticks: recorded });
    return run;
  }

  private async runInTransaction(
    job: Job<Tx>,
    tick: Date,
  ): Promise<{ catchUp: Date[]; retry: boolean }> {
    const schema = this.schema;
    for (;;) {
      const started = performance.now();
      let outcome:
        | { kind: 'done' }
        | { kind: 'ran' | 'failed'; attempt: number; error?: unknown; catchUp: Date[] };
      try {
        const r = await this.locks.withLock(
          job.key,
          async (tx, ctx) => {
            const found = tickStatement(schema, job.name, tick);
            const [row] = await ctx.query(found.text, found.params);
            if (row && !(row.status === 'FAILED' && Number(row.attempt) < job.maxAttempts))
              return { kind: 'done' as const };
            const catchUp = row ? [] : await this.catchUp(job, tick, ctx.query);
            const claim = claimTickStatement(
              schema,
              job.name,
              tick,
              this.owner,
              null,
              job.maxAttempts,
            );
            const [claimed] = await ctx.query(claim.text, claim.params);
            if (!claimed) return { kind: 'done' as const };
            const attempt = Number(claimed.attempt);
            // The job's own work rolls back to here on failure; the claim and its FAILED record commit.
            await ctx.query(SAVEPOINT);
            try {
              await job.handler({
                mode: 'transaction',
                tx,
                query: ctx.query,
                job: job.name,
                tick,
                attempt,
                signal: this.runSignal(job, ctx.signal),
              });
            } catch (error) {
              // Lost connection or stop(): let the whole transaction roll back; the tick stays free.
              if (ctx.signal.aborted || this.stopping.signal.aborted) throw error;
              await ctx.query(ROLLBACK_TO_SAVEPOINT);
              const failed = finishTickStatement(schema, job.name, tick, null, {
                failed: true,
                error: error instanceof Error ? `${error.name}: ${error.message}` : String(error),
              });
              await ctx.query(failed.text, failed.params);
              return { kind: 'failed' as const, attempt, error, catchUp };
            }
            await ctx.query(RELEASE_SAVEPOINT);
            const done = finishTickStatement(schema, job.name, tick, null, { failed: false });
            await ctx.query(done.text, done.params);
            return { kind: 'ran' as const, attempt, catchUp };
          },
          {
            wait: true,
            timeoutMs: job.claimTimeoutMs,
            signal: this.stopping.signal,
            ...(job.timeoutMs !== undefined && { statementTimeoutMs: job.timeoutMs }),
          },
        );
        if (!r.executed) return { catchUp: [], retry: false };
        outcome = r.result;
      } catch (error) {
        if (error instanceof LockTimeoutError) {
          if (job.overlap === 'queue' && !this.stopping.signal.aborted) continue;
          await this.skipHeld(job, tick);
          return { catchUp: [], retry: false };
        }
        throw error;
      }
      if (outcome.kind === 'done') {
        this.emit({ type: 'skipped-done', job: job.name, tick });
        return { catchUp: [], retry: false };
      }
      if (outcome.kind === 'failed') {
        const willRetry = outcome.attempt < job.maxAttempts;
        this.emit({
          type: 'failed',
          job: job.name,
          tick,
          attempt: outcome.attempt,
          error: outcome.error,
          willRetry,
        });
        return { catchUp: outcome.catchUp, retry: willRetry };
      }
      this.emit({
        type: 'ran',
        job: job.name,
        tick,
        attempt: outcome.attempt,
        durationMs: performance.now() - started,
      });
      return { catchUp: outcome.catchUp, retry: false };
    }
  }

  private async runInLease(job: Job<Tx>, tick: Date): Promise<{ catchUp: Date[]; retry: boolean }> {
    const schema = this.schema;
    const settings = leaseSettings(job.lease);
    for (;;) {
      const started = performance.now();
      let claim: JobResult<LeaseClaim>;
      try {
        claim = await this.locks.withLock<LeaseClaim>(
          job.key,
          async (_tx, ctx) => {
            const found = tickStatement(schema, job.name, tick);
            const [row] = await ctx.query(found.text, found.params);
            if (row && !(row.status === 'FAILED' && Number(row.attempt) < job.maxAttempts))
              return { kind: 'done' as const };
            const catchUp = row ? [] : await this.catchUp(job, tick, ctx.query);
            const lease = await claimLease(
              ctx.query,
              schema,
              SCHEDULER_NAMESPACE,
              job.name,
              settings,
            );
            if ('holder' in lease) return { kind: 'held' as const, catchUp };
            // Earlier runs that never finished under their token died with their holder.
            const abandon = abandonStatement(schema, job.name, lease.token);
            await ctx.query(abandon.text, abandon.params);
            const claimTick = claimTickStatement(
              schema,
              job.name,
              tick,
              this.owner,
              lease.token,
              job.maxAttempts,
            );
            const [claimed] = await ctx.query(claimTick.text, claimTick.params);
            if (!claimed) throw new LockkitError('LEASE_LOST', 'tick claimed concurrently'); // cannot happen under the lock
            return { kind: 'claimed' as const, lease, attempt: Number(claimed.attempt), catchUp };
          },
          { wait: true, timeoutMs: job.claimTimeoutMs, signal: this.stopping.signal },
        );
      } catch (error) {
        if (error instanceof LockTimeoutError) {
          await this.skipHeld(job, tick);
          return { catchUp: [], retry: false };
        }
        throw error;
      }
      if (!claim.executed) return { catchUp: [], retry: false };
      const c = claim.result;
      if (c.kind === 'done') {
        this.emit({ type: 'skipped-done', job: job.name, tick });
        return { catchUp: [], retry: false };
      }
      if (c.kind === 'held') {
        if (job.overlap === 'queue' && !this.stopping.signal.aborted) {
          await sleep(Math.min(1000, Math.floor(settings.ttlMs / 4)), this.stopping.signal);
          if (!this.stopping.signal.aborted) continue;
        }
        await this.skipHeld(job, tick);
        return { catchUp: c.catchUp, retry: false };
      }
      const { lease, attempt } = c;
      try {
        await holdLease(
          this.locks.executor,
          schema,
          lease,
          settings,
          (context) =>
            job.handler({
              mode: 'lease',
              lease: context,
              job: job.name,
              tick,
              attempt,
              signal: this.runSignal(job, context.signal),
            }),
          {
            signal: this.stopping.signal,
            fenced: (fencedTask) => this.fenced(lease.token, job.name, fencedTask),
            alsoRecord: (record) => [
              finishTickStatement(schema, job.name, tick, lease.token, record),
            ],
          },
        );
      } catch (error) {
        if (error instanceof LeaseLostError) {
          this.emit({ type: 'lease-lost', job: job.name, tick, error });
          return { catchUp: c.catchUp, retry: false };
        }
        const willRetry = attempt < job.maxAttempts;
        this.emit({ type: 'failed', job: job.name, tick, attempt, error, willRetry });
        return { catchUp: c.catchUp, retry: willRetry };
      }
      this.emit({
        type: 'ran',
        job: job.name,
        tick,
        attempt,
        durationMs: performance.now() - started,
      });
      return { catchUp: c.catchUp, retry: false };
    }
  }

  private fenced<T>(
    token: bigint,
    job: string,
    task: (tx: Tx, query: QueryFn) => Promise<T> | T,
  ): Promise<T> {
    const fence = fenceStatement(this.schema, SCHEDULER_NAMESPACE, job, token);
    return this.locks.executor.transaction(async ({ query, tx }) => {
      if ((await query(fence.text, fence.params)).length === 0) {
        throw new LeaseLostError(
          `fenced write refused: job ${job} is no longer held under token ${token}.`,
          token,
        );
      }
      return task(tx, query);
    });
  }

  private async prune(): Promise<void> {
    for (const job of this.jobs.values()) {
      await this.query(pruneStatement(this.schema, job.name, this.retentionMs)).catch(() => []);
    }
  }
}

/**
 * A scheduler over a lock client (any adapter). Its ledger lives in the client's schema: run
 * `locks.migrate()` first.
 */
export function createScheduler<Tx, Session>(
  locks: LockClient<Tx, Session>,
  options: SchedulerOptions = {},
): Scheduler<Tx> {
  return new Scheduler(locks as LockClient<Tx, unknown>, options);
}
