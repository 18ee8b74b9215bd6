/**
 * The distributed cron scheduler: every instance registers the same jobs, and each scheduled tick
 * runs on exactly one of them, whatever their clocks say.
 *
 * Each tick has one row in a ledger (see `ledger.ts` for the protocol). A node that fires a tick
 * waits (briefly) for the job's advisory lock, takes the tick's own lock, then looks the tick up
 * in the ledger: a late node finds it taken and skips; a node that cannot get the job's lock asks
 * who holds it (see `whenHeld`) — a run of this very tick (it waits for the
 * outcome), a transaction proven to be running ANOTHER tick (an overlap: skipped or queued), or
 * anything else: nobody any more, or a holder that shows no other tick, such as a run of this tick
 * between its two lock statements (it waits for the job's lock again).
 *
 * @packageDocumentation
 */
import { createHash, randomUUID } from 'node:crypto';
import { hostname } from 'node:os';
import { whenAborted } from './abort-listeners.js';
import { type Clock, type ClockTimer, MAX_TIMER_MS, systemClock } from './clock.js';
import { taskEndedTransaction } from './commit-truth.js';
import { isConnectionLoss } from './connection-loss.js';
import { type CronSchedule, noTickError } from './cron-schedule.js';
import {
  CommitRolledBackError,
  isLockkitError,
  LeaseLostError,
  LockKeyError,
  LockkitError,
  LockNotHeldError,
  LockTimeoutError,
} from './errors.js';
import type { QueryFn } from './executor.js';
import { JobIndex } from './job-index.js';
import { jobKey } from './job-name.js';
import { LockKey } from './keys.js';
import {
  type ClaimedLease,
  claimLease,
  fencedWrite,
  holdLease,
  type LeaseContext,
  type LeaseOptions,
  leaseSettings,
} from './lease.js';
import {
  Ledger,
  type LedgerJob,
  MAX_CATCH_UP,
  type RunRecord,
  registrationRows,
  type TickState,
} from './ledger.js';
import type { JobResult, LockClient } from './lock.js';
import { ownTransaction } from './own-transaction.js';
import { sqlState } from './postgres-errors.js';
import { ScheduleBook } from './schedule-book.js';
import { minimumGapMs } from './schedule-gap.js';
import { SchedulerMembership } from './scheduler-membership.js';
import { SCHEDULER_NAMESPACE } from './scheduler-namespace.js';
import {
  checkJobOptions,
  checkSchedulerOptions,
  isCatchUpPolicy,
} from './scheduler-option-checks.js';
import { quoteIdentifier } from './sql/identifiers.js';
import { checkMilliseconds, lockStatement } from './sql/locks.js';
import {
  RECORD_SETTINGS,
  RELEASE_SAVEPOINT,
  ROLLBACK_TO_SAVEPOINT,
  RUN_SETTINGS,
  SAVEPOINT,
} from './sql/scheduler.js';
import { partialRegistrationsStatement } from './sql/scheduler-members.js';
import { StringTable } from './string-table.js';
import { TickTimers } from './tick-timers.js';
import { WakeQueue } from './wake-queue.js';
import { timelineSource } from './wal-timeline.js';

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
  /** IANA time zone the cron expression is read in (default: UTC, never the host's zone). */
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
  /**
   * Fire each tick after a random delay below this many ms, to spread load. Default 0. Must be
   * below half the schedule's smallest gap between two ticks (checked over its next 1,000 ticks
   * and around the DST changes of the next 366 days). A starting scheduler still owes the ticks of
   * the last `jitterMs` (a node it replaces may not have fired them yet).
   */
  readonly jitterMs?: number;
  /**
   * When both day-of-month and day-of-week are restricted (`0 9 1-7 * 1`): `false` (default,
   * croner and Vixie cron) fires on a day matching *either*; `true` only on a day matching
   * *both* — node-cron's meaning ("the first Monday").
   */
  readonly domAndDow?: boolean;
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
  /** How late the handler started, in ms after {@link RunInfo.tick} (on the scheduler's clock). */
  readonly lateMs: number;
  /** `true` when this tick is run by catch-up (nobody ran it when it was due), not by its own timer. */
  readonly catchUp: boolean;
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

/** A job's handler, either mode (check `run.mode`). */
export type JobHandler<Tx> = (run: TransactionRun<Tx> | LeaseRun<Tx>) => Promise<unknown> | unknown;

/** A transaction-mode job's handler: `run.tx` and `run.query` without a `run.mode` check. */
export type TransactionJobHandler<Tx> = (run: TransactionRun<Tx>) => Promise<unknown> | unknown;

/** A lease-mode job's handler: `run.lease` without a `run.mode` check. */
export type LeaseJobHandler<Tx> = (run: LeaseRun<Tx>) => Promise<unknown> | unknown;

/** Options of a transaction-mode job: `mode` omitted or `'transaction'`. */
export interface TransactionJobOptions extends JobOptions {
  readonly mode?: 'transaction';
}

/** Options of a lease-mode job: `mode: 'lease'`. */
export interface LeaseJobOptions extends JobOptions {
  readonly mode: 'lease';
}

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
  /**
   * The tick was decided already: its ledger row says so, or it is older than what pruning keeps,
   * with no row, rows after it and none before (its row may have been pruned; see `retentionMs`).
   */
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

/** Every outcome of a scheduled tick (all event types but infrastructure `error`s and `schedule-conflict`). */
export const SCHEDULER_OUTCOMES = [
  'ran',
  'failed',
  'skipped-held',
  'skipped-done',
  'missed',
  'lease-lost',
  'queue-full',
] as const satisfies readonly SchedulerEventType[];

/** Options of a scheduler. */
export interface SchedulerOptions {
  /**
   * Who runs the jobs, stored in the ledger: a non-empty string without NUL (U+0000) or a lone
   * UTF-16 surrogate (else `OPTION_INVALID`). Default `host:pid:random`.
   */
  readonly owner?: string;
  /**
   * Where ticks are timed: the time, and timers. Default the system clock; tests pass a
   * {@link SimulatedClock} to run years of schedule in moments.
   */
  readonly clock?: Clock;
  /** Overrides the clock's time, in ms since the epoch (tests pass a skewed `Date.now`). */
  readonly now?: () => number;
  /**
   * Ledger rows older than this are deleted. Default 7 days; 0 keeps everything. Whatever it is,
   * each job's latest row, its PENDING and RUNNING rows and every row after the oldest of those
   * stay, and so does a row a decision may still read (younger than twice `catchUpGraceMs`, plus
   * the job's `jitterMs` and `claimTimeoutMs`, plus 70 s): deleting it would run its tick again.
   * Rows are pruned every `retentionMs / 2`, at most every 10 s and at least every 10 minutes.
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
  /**
   * Which instances decide a job's ticks.
   * - `'every-instance'` (default): every instance that registered the job decides each of its
   *   ticks; the job's lock and the ledger let one of them run it. The database's work per tick
   *   grows with instances × jobs.
   * - `'owned'`: one live instance decides each job — its owner, by rendezvous hashing over the
   *   namespace's members, each kept live by a heartbeat row (one statement per instance every
   *   third of `memberTtlMs`). The work per tick grows with the jobs due, not with the instances.
   *   An instance that stops hands its jobs on at once (when stop() begins, not once its running
   *   tasks end); one that dies, once its row expires:
   *   within `memberTtlMs` and one heartbeat. Its successors run the ticks it left undecided
   *   meanwhile (whatever the catch-up policy: no tick was missed, only handed over late).
   *
   * Both may run side by side in one namespace (an `'every-instance'` instance decides every job
   * it has, as always). Needs schema version 4 (`migrate()`).
   */
  readonly distribution?: 'every-instance' | 'owned';
  /**
   * Owned distribution: how long an instance's heartbeat keeps it a member (ms, database clock).
   * Its heartbeat beats every third of it; an instance that could not beat for five sixths of it
   * decides every job until it can. Default 3000; from 300 to 30000.
   */
  readonly memberTtlMs?: number;
}

/**
 * A job as a tick reads it, made from the job's row of the scheduler's tables when a tick (or
 * `runTick`, a heartbeat's conflict, a prune) needs it, and not kept: 10,000 jobs kept 10,000 job
 * records (~100 bytes each, and their map entries), which V8 counted twice as surviving young
 * allocation on the way to the old generation (docs/performance.md).
 */
interface Job<Tx> extends LedgerJob {
  /** The job's row in the scheduler's tables. */
  readonly row: number;
  /** The job's lock key: made when first needed by this tick (`Scheduler.keyOf`). */
  key: LockKey | undefined;
  /** Hash of the name, for the tick locks' keys: made when first needed by this tick. */
  nameHash: string | undefined;
  readonly cron: CronSchedule;
  readonly handler: JobHandler<Tx>;
  /** How the job runs: one object for all the jobs registered with the same options. */
  readonly settings: JobSettings;
}

/**
 * A job's options as read at registration. Jobs registered alike share one object
 * ({@link Scheduler}'s `settingsOf`): 10,000 jobs kept 10,000 copies of the same eleven fields.
 */
interface JobSettings {
  readonly timezone: string;
  readonly mode: 'transaction' | 'lease';
  readonly overlap: OverlapPolicy;
  readonly catchUp: CatchUpPolicy;
  readonly maxAttempts: number;
  readonly retryDelayMs: number;
  readonly timeoutMs: number | undefined;
  readonly jitterMs: number;
  readonly claimTimeoutMs: number;
  readonly queueLimit: number;
  readonly lease: LeaseOptions;
}

/**
 * How many distinct settings objects a scheduler shares among its jobs. Jobs registered with yet
 * other options keep their own: sharing is a saving, never a look-up that grows with the jobs.
 */
const MAX_SHARED_SETTINGS = 16;

/** How many handlers one chunk of a scheduler's handler column holds. */
const HANDLER_CHUNK = 1024;

/** Whether two jobs' settings are the same, lease and catch-up policy included by identity. */
function sameSettings(a: JobSettings, b: JobSettings): boolean {
  return (
    a.timezone === b.timezone &&
    a.mode === b.mode &&
    a.overlap === b.overlap &&
    a.catchUp === b.catchUp &&
    a.maxAttempts === b.maxAttempts &&
    a.retryDelayMs === b.retryDelayMs &&
    a.timeoutMs === b.timeoutMs &&
    a.jitterMs === b.jitterMs &&
    a.claimTimeoutMs === b.claimTimeoutMs &&
    a.queueLimit === b.queueLimit &&
    a.lease === b.lease
  );
}

/** What one attempt at one tick came to on this node. */
interface TickOutcome {
  /** Ticks catch-up decided to run now. */
  readonly catchUp: readonly Date[];
  /**
   * Whether this node should now run the job's PENDING ticks that are due: it ran the tick
   * (successfully or not), or queued it behind older ones, or queued it behind a run that has
   * ended since, or — with overlap 'queue', in transaction mode — held the job's lock to find the
   * tick done (a node that queued a tick meanwhile left the queue to it).
   */
  readonly drain: boolean;
}

const NOTHING: TickOutcome = { catchUp: [], drain: false };

/** The first and the longest pause between two looks at a lease held by an earlier tick's run. */
const LEASE_POLL_MS = [25, 250] as const;

/** Adds `by` to `key`'s count in `counts`, removing the key when its count comes to 0. */
function countIn<K>(counts: Map<K, number>, key: K, by: number): void {
  const count = (counts.get(key) ?? 0) + by;
  if (count <= 0) counts.delete(key);
  else counts.set(key, count);
}

/** Resolves true after `ms`, or false as soon as `signal` aborts. */
function pause(ms: number, signal: AbortSignal): Promise<boolean> {
  if (signal.aborted) return Promise.resolve(false);
  return new Promise((resolve) => {
    const done = (waited: boolean) => {
      clearTimeout(timer);
      forget();
      resolve(waited);
    };
    const timer = setTimeout(() => done(true), ms);
    const forget = whenAborted(signal, () => done(false));
  });
}

/** Why a node attempts a tick: its own timer, catch-up, or a PENDING row of the ledger that is due. */
type TickSource = 'timer' | 'catch-up' | 'pending';

/** How often registrations are refreshed, and conflicts looked for again. */
const HEARTBEAT_MS = 60_000;

/**
 * Owned distribution: how far back a new owner runs the ticks its predecessor left, at most.
 * Older ticks (a namespace whose every member was down, or cut off from the database) are the
 * catch-up policy's, as in every-instance distribution.
 */
const MAX_OWED_MS = 60_000;

/**
 * Prune passes run every `retentionMs / 2`, within these bounds: a short retention (legal down to
 * 1 ms) would otherwise start a pass every half millisecond, each queuing a transaction a job.
 */
const MIN_PRUNE_INTERVAL_MS = 10_000;
const MAX_PRUNE_INTERVAL_MS = 600_000;

/** Owned distribution: the longest `memberTtlMs`, so that a death is seen well within MAX_OWED_MS. */
const MAX_MEMBER_TTL_MS = 30_000;

/**
 * How many jobs one transaction registers in the ledger at start (see `announce`): their JSON,
 * one parameter, stays below ~1.5 MB with names of the longest allowed (1 KiB).
 */
const ANNOUNCE_BATCH = 1000;

/** What the claim transaction of a lease-mode tick decided. */
type LeaseClaim =
  | { readonly kind: 'done' }
  | { readonly kind: 'held'; readonly decision: HeldDecision | 'later'; readonly catchUp: Date[] }
  /** Queued behind older due ticks: this node runs the due ones next, oldest first. */
  | { readonly kind: 'behind'; readonly decision: HeldDecision; readonly catchUp: Date[] }
  /** An earlier tick's run holds the job: look again shortly. */
  | { readonly kind: 'busy' }
  | {
      readonly kind: 'claimed';
      readonly lease: ClaimedLease;
      readonly attempt: number;
      readonly catchUp: Date[];
      /** The claimed tick was held PENDING for catch-up. */
      readonly heldForCatchUp: boolean;
    };

/** What a node does with a tick whose job another run holds. */
type HeldDecision = 'again' | 'skipped' | 'queued' | 'full' | 'exists';

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

const describeError = (error: unknown) =>
  error instanceof Error ? `${error.name}: ${error.message}` : String(error);

/** The FAILED record of a tick whose transaction-mode handler committed the transaction itself. */
const selfCommittedRecord = (job: { readonly name: string }): RunRecord => ({
  kind: 'failed',
  error: describeError(taskEndedTransaction(`job "${job.name}"`)),
});

/**
 * Lease mode: how many times beyond a job's attempts a run interrupted by the database (its
 * fenced write lost its connection) is given back to run again before it counts as failed.
 */
const INTERRUPTED_GIVE_BACKS = 3;

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
  /**
   * The jobs, as rows of columns in registration order: names as code units (the caller's strings
   * are not kept, see {@link StringTable}), handlers (the caller's functions) in chunks of
   * {@link HANDLER_CHUNK}, the rest numbers in typed arrays. No object a job (see {@link Job}).
   */
  private readonly names = new StringTable();
  private readonly handlers: JobHandler<Tx>[][] = [];
  /** Each job's row in {@link Scheduler.schedules}. */
  private jobSchedules = new Int32Array(16);
  /** Each job's settings, an index into {@link Scheduler.settingsList}. */
  private jobSettings = new Int32Array(16);
  /**
   * Each job's tick timer, a row of {@link Scheduler.timers} (its own, or the one it shares with
   * the jobs on its schedule started with it, see `scheduleTogether`); -1 before it is timed.
   */
  private jobTimers = new Int32Array(16).fill(-1);
  /**
   * The jobs by the second number of their lock keys, as int32s, to refuse a colliding name and
   * find a job by name in O(1): the first number is the namespace's, the same for every job of
   * this scheduler (`jobKey`).
   */
  private readonly byKey = new JobIndex();
  /** The last conflict reported for a job, by row, so that one conflict is reported once. */
  private readonly conflicts = new Map<number, string>();
  /** Parsed schedules, each held once for all the jobs on it. */
  private readonly schedules = new ScheduleBook();
  /**
   * Every job's settings object: those shared by the jobs registered alike (see `settingsOf`), at
   * most {@link MAX_SHARED_SETTINGS}, and those of the jobs that keep their own.
   */
  private readonly settingsList: JobSettings[] = [];
  /** Indices in {@link Scheduler.settingsList} of the shared settings. */
  private readonly sharedSettings: number[] = [];
  /** The lease options of every lease-mode job registered without any: one object for all. */
  private readonly ownerOnlyLease: LeaseOptions;
  private readonly listeners = new Map<SchedulerEventType, Set<(event: never) => void>>();
  private readonly running = new Set<Promise<void>>();
  /**
   * The (job row, tick ms) pairs this scheduler is deciding or running now, with how many
   * attempts at each: {@link runTick} refuses one of them (see there).
   */
  private readonly deciding = new Map<string, number>();
  /**
   * The ticks (ms, with how many of them) whose firing is under way here: waiting for what the
   * job's last owner left, for the job's lock, deciding or running. Owned distribution: a stop
   * dates this member's departure no later than the oldest (see {@link stop}).
   */
  private readonly firing = new Map<number, number>();
  private readonly retryTimers = new Set<ClockTimer>();
  /**
   * By job name, the timer of a drain that left a PENDING tick not yet due on this node's clock
   * (see `followUp`): at most one a job, the earliest.
   */
  private readonly followUps = new Map<
    string,
    { readonly at: number; readonly timer: ClockTimer }
  >();
  /**
   * By job name, the timer of a node that queued a tick behind a run still holding the job (see
   * `watchHolder`): at most one a job.
   */
  private readonly holderWatches = new Map<string, ClockTimer>();
  /**
   * Owned distribution: by job row, the owed ticks (ms) this owner left to a run still going (their
   * lock was held when it held the rest; see {@link holdOwedTicks}). Looked at again every
   * `claimTimeoutMs` until they have a row or are held; catch-up leaves them alone meanwhile: a
   * tick whose run dies was not missed, only handed over late.
   */
  private readonly owedBusy = new Map<number, Set<number>>();
  /** By job row, the timer of the next look at its {@link owedBusy} ticks. */
  private readonly owedWatches = new Map<number, ClockTimer>();
  /**
   * By job name, the drain pass running on this node (`done`), and the one pass asked for while it
   * runs (`next`, started when it ends). One at a time a job: several would all go for the same
   * oldest tick, and all but one find it done after waiting on the job's lock.
   */
  private readonly draining = new Map<string, { done: Promise<void>; next?: Promise<void> }>();
  private readonly stopping = new AbortController();
  private readonly owner: string;
  private readonly clock: Clock;
  /** Where the tick timers wait: one clock timer for all the jobs, not one a job. */
  private readonly wakeQueue: WakeQueue;
  /**
   * Every tick timer, a row each (see {@link TickTimers}). A timer's subject is a job's row, or
   * `-1 - i` for the run of jobs `runs[i]` that share it (see `scheduleTogether`).
   */
  private readonly timers: TickTimers;
  /** The rows of the jobs of each shared timer. */
  private readonly runs: Int32Array[] = [];
  private readonly now: () => number;
  private readonly retentionMs: number;
  private readonly graceMs: number;
  private readonly schema: string;
  /** Namespace of the job and tick lock keys and of lease-mode leases. */
  private readonly lockNamespace: string;
  private readonly ledger: Ledger;
  /** The ledger's namespace: the option, or '' without one. */
  private readonly ledgerNamespace: string;
  private started = false;
  /** Whether a prune pass is running (see {@link prune}). */
  private pruning = false;
  private pruneTimer: NodeJS.Timeout | undefined;
  private heartbeatTimer: NodeJS.Timeout | undefined;
  /** Whether this instance's registrations are in the ledger (else the heartbeat retries them). */
  private announced = false;
  /** Owned distribution: this instance's membership of its namespace; undefined otherwise. */
  private readonly membership: SchedulerMembership | undefined;
  private membershipTimer: NodeJS.Timeout | undefined;
  /** Owned distribution: jobs registered by only some live members, and by which. */
  private partialRegistrations = new Map<string, ReadonlySet<string>>();
  /**
   * Owned distribution: rows below this were registered (announced) when the registrations were
   * last read. A job registered since may be unknown to the others: it is decided here meanwhile.
   */
  private registrationsReadFor = 0;
  /** Rows below this are in the schedules table (announced), as far as this instance knows. */
  private announcedRows = 0;
  /** Announcements of jobs registered after start() still in flight. */
  private lateAnnouncements = 0;
  /** Owned distribution: jobs whose owed ticks are being held, by row; their ticks wait for it. */
  private readonly owing = new Map<number, Promise<void>>();

  /** @internal use {@link createScheduler} */
  constructor(
    private readonly locks: LockClient<Tx, unknown>,
    options: SchedulerOptions = {},
  ) {
    checkSchedulerOptions(options);
    this.schema = quoteIdentifier(locks.schema);
    this.owner = options.owner ?? `${hostname()}:${process.pid}:${randomUUID().slice(0, 8)}`;
    const clock = options.clock ?? systemClock;
    const now = options.now;
    this.clock =
      now === undefined ? clock : { now, setTimer: (ms, callback) => clock.setTimer(ms, callback) };
    this.now = () => this.clock.now();
    this.wakeQueue = new WakeQueue(this.clock);
    this.timers = new TickTimers({
      clock: this.clock,
      queue: this.wakeQueue,
      nextRun: (schedule, after) => this.schedules.nextRun(schedule, after),
      onTick: (tick, subject) => {
        if (subject >= 0) this.track(this.fire(this.jobAt(subject), tick));
        else
          for (const row of this.runs[-1 - subject] ?? [])
            this.track(this.fire(this.jobAt(row), tick));
      },
    });
    this.ownerOnlyLease = Object.freeze({ owner: this.owner });
    this.retentionMs = count(options.retentionMs, 'retentionMs', 0, 7 * 24 * 3600 * 1000);
    this.graceMs = count(options.catchUpGraceMs, 'catchUpGraceMs', 0, 2000);
    const namespace = options.namespace;
    if (
      namespace !== undefined &&
      (typeof namespace !== 'string' ||
        namespace.length === 0 ||
        namespace.length > 100 ||
        namespace.includes('\u0000'))
    ) {
      throw new LockkitError(
        'OPTION_INVALID',
        'namespace must be a non-empty string of at most 100 characters, without NUL.',
      );
    }
    this.lockNamespace =
      namespace === undefined ? SCHEDULER_NAMESPACE : `${SCHEDULER_NAMESPACE}/${namespace}`;
    this.ledgerNamespace = namespace ?? '';
    this.ledger = new Ledger(
      { schema: this.schema, namespace: this.ledgerNamespace },
      this.owner,
      this.lockNamespace,
    );
    const distribution = options.distribution ?? 'every-instance';
    if (distribution !== 'every-instance' && distribution !== 'owned')
      throw new LockkitError('OPTION_INVALID', `distribution must be 'every-instance' or 'owned'.`);
    const memberTtlMs = count(options.memberTtlMs, 'memberTtlMs', 300, 3000);
    // A death is seen within a TTL and a beat of the last one; the successor owes the ticks from
    // then, back to MAX_OWED_MS at most: a longer TTL would leave the oldest of them to catch-up.
    if (memberTtlMs > MAX_MEMBER_TTL_MS)
      throw new LockkitError(
        'OPTION_INVALID',
        `memberTtlMs must be at most ${MAX_MEMBER_TTL_MS} (a dead member's ticks are owed for ${MAX_OWED_MS} ms), got ${memberTtlMs}.`,
      );
    if (options.memberTtlMs !== undefined && distribution !== 'owned')
      throw new LockkitError('OPTION_INVALID', `memberTtlMs applies to distribution 'owned' only.`);
    this.membership =
      distribution === 'owned'
        ? new SchedulerMembership(
            (statement) => this.query((q) => q(statement.text, statement.params)),
            { schema: this.schema, namespace: this.ledgerNamespace },
            this.owner,
            {
              heartbeatMs: Math.floor(memberTtlMs / 3),
              ttlMs: memberTtlMs,
              staleMs: Math.floor((memberTtlMs * 5) / 6),
            },
            this.now,
            (job) => this.partialRegistrations.get(job),
            (live) => this.readRegistrations(live),
          )
        : undefined;
  }

  /**
   * Registers a job. Fails at once on a duplicate name, a name the ledger cannot store (NUL, a lone
   * surrogate, over 1 KiB), a name whose lock key collides with another job's, an invalid cron
   * expression (seconds field optional) or time zone, a schedule with no tick to come, a
   * `jitterMs` not below half the schedule's smallest gap, or options of the wrong shape
   * (`OPTION_INVALID`). A transaction-mode handler gets a {@link TransactionRun}.
   */
  register(
    name: string,
    cron: string,
    handler: TransactionJobHandler<Tx>,
    options?: TransactionJobOptions,
  ): this;
  /** Registers a lease-mode job: its handler gets a {@link LeaseRun}. */
  register(
    name: string,
    cron: string,
    handler: LeaseJobHandler<Tx>,
    options: LeaseJobOptions,
  ): this;
  /** Registers a job whose mode is known only at run time: the handler checks `run.mode`. */
  register(name: string, cron: string, handler: JobHandler<Tx>, options?: JobOptions): this;
  register(
    name: string,
    cron: string,
    handler: JobHandler<Tx> | TransactionJobHandler<Tx> | LeaseJobHandler<Tx>,
    options: JobOptions = {},
  ): this {
    checkJobOptions(name, options);
    const key = jobKey(this.lockNamespace, name);
    // By the key's numbers alone: two names that hash to one key must collide here.
    const keyId = key.pgLocks.objid | 0;
    const existing = this.byKey.get(keyId);
    if (existing >= 0 && this.names.equals(existing, name))
      throw new LockkitError('OPTION_INVALID', `job "${name}" is already registered.`);
    if (existing >= 0) {
      const colliding = this.names.get(existing);
      throw new LockkitError(
        'OPTION_INVALID',
        `job names "${name}" and "${colliding}" hash to the same lock key ${key}: rename one.`,
      );
    }
    if (typeof handler !== 'function')
      throw new LockkitError('OPTION_INVALID', 'the handler must be a function.');
    let schedule: number;
    if (options.timezone !== undefined && typeof options.timezone !== 'string')
      throw new LockkitError('OPTION_INVALID', `job "${name}": timezone must be an IANA name.`);
    if (typeof cron !== 'string')
      throw new LockkitError(
        'OPTION_INVALID',
        `job "${name}": the cron expression must be a string.`,
      );
    if (options.domAndDow !== undefined && typeof options.domAndDow !== 'boolean')
      throw new LockkitError('OPTION_INVALID', `job "${name}": domAndDow must be a boolean.`);
    const reading = { timezone: options.timezone, domAndDow: options.domAndDow };
    try {
      schedule = this.schedules.book(cron, reading, new Date(this.now()));
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
    const overlap = options.overlap === undefined ? 'skip' : options.overlap;
    if (overlap !== 'skip' && overlap !== 'queue')
      throw new LockkitError('OPTION_INVALID', `overlap must be 'skip' or 'queue'.`);
    const catchUp = options.catchUp === undefined ? 'skip' : options.catchUp;
    if (!isCatchUpPolicy(catchUp)) {
      throw new LockkitError(
        'OPTION_INVALID',
        `catchUp must be 'skip', 'latest' or { withinMs } with a positive integer withinMs.`,
      );
    }
    const lease =
      options.lease === undefined ? this.ownerOnlyLease : { ...options.lease, owner: this.owner };
    if (mode === 'lease') leaseSettings(lease); // fail early on bad lease settings
    // The jobs of one schedule ask from nearly the same instant: croner answers the first.
    const from = this.now();
    if (Number.isNaN(this.schedules.nextRun(schedule, from)))
      throw noTickError(cron, new Date(from), name);
    const timezone = options.timezone ?? 'UTC';
    const jitterMs = count(options.jitterMs, 'jitterMs', 0, 0);
    // Croner's resolution is 1 s: a jitter below half of it needs no look at the schedule.
    if (jitterMs >= 500) {
      const gap = minimumGapMs(
        this.schedules.schedule(schedule),
        new Date(this.now()),
        options.timezone,
      );
      if (jitterMs * 2 >= gap) {
        throw new LockkitError(
          'OPTION_INVALID',
          `job "${name}": jitterMs ${jitterMs} must be below half the smallest gap between two ticks of "${cron}" (${gap} ms), so that two jittered runs stay at least half a gap apart.`,
        );
      }
    }
    const settings = this.settingsOf({
      timezone,
      mode,
      overlap,
      catchUp,
      maxAttempts: 1 + count(options.retries, 'retries', 0, 0),
      retryDelayMs: count(options.retryDelayMs, 'retryDelayMs', 0, 1000),
      timeoutMs:
        options.timeoutMs === undefined ? undefined : count(options.timeoutMs, 'timeoutMs', 1, 1),
      jitterMs,
      claimTimeoutMs: count(options.claimTimeoutMs, 'claimTimeoutMs', 1, 5000),
      queueLimit: count(options.queueLimit, 'queueLimit', 1, 100),
      lease,
    });
    const row = this.names.size;
    this.room(row + 1);
    this.names.add(name);
    // Chunks made at their full length: no array grown (and copied) a job at a time.
    if (row % HANDLER_CHUNK === 0) this.handlers.push(new Array(HANDLER_CHUNK));
    // The overloads tie the handler's run type to `mode`, the run it gets here.
    (this.handlers[this.handlers.length - 1] as JobHandler<Tx>[])[row % HANDLER_CHUNK] =
      handler as JobHandler<Tx>;
    this.jobSchedules[row] = schedule;
    this.jobSettings[row] = settings;
    this.byKey.set(keyId, row);
    if (this.started) {
      this.lateAnnouncements++;
      void this.announce(row, row + 1).then(
        () => {
          this.lateAnnouncements--;
          if (this.announced) this.announcedUpTo(this.names.size);
        },
        () => {
          // The next heartbeat announces every job again.
          this.lateAnnouncements--;
          this.announced = false;
        },
      );
      this.schedule(row);
    }
    return this;
  }

  /** Grows the jobs' typed columns to hold `rows` rows, doubling. */
  private room(rows: number): void {
    const size = this.jobSchedules.length;
    if (rows <= size) return;
    const grow = (column: Int32Array, fill: number): Int32Array<ArrayBuffer> => {
      const bigger = new Int32Array(size * 2).fill(fill, size);
      bigger.set(column);
      return bigger;
    };
    this.jobSchedules = grow(this.jobSchedules, 0);
    this.jobSettings = grow(this.jobSettings, 0);
    this.jobTimers = grow(this.jobTimers, -1);
  }

  /** The job of `row`, as a tick reads it (see {@link Job}): made now, not kept. */
  private jobAt(row: number): Job<Tx> {
    const schedule = this.jobSchedules[row] as number;
    return {
      row,
      name: this.names.get(row),
      hash: this.schedules.hash(schedule),
      key: undefined,
      nameHash: undefined,
      cron: this.schedules.schedule(schedule),
      handler: this.handlers[Math.floor(row / HANDLER_CHUNK)]?.[
        row % HANDLER_CHUNK
      ] as JobHandler<Tx>,
      settings: this.settingsList[this.jobSettings[row] as number] as JobSettings,
    };
  }

  /** The row of the job named `name`, or -1 (also for a name no job could have). */
  private rowOf(name: string): number {
    let objid: number;
    try {
      objid = jobKey(this.lockNamespace, name).pgLocks.objid | 0;
    } catch (error) {
      // Empty, too long, a lone surrogate: registration refuses such a name, so no job has it.
      if (error instanceof LockKeyError) return -1;
      throw error;
    }
    const row = this.byKey.get(objid);
    return row >= 0 && this.names.equals(row, name) ? row : -1;
  }

  /**
   * The index in {@link Scheduler.settingsList} of the one settings object of the jobs registered
   * with `settings`' values: a job given lease options of its own, or a catch-up window, keeps its
   * own object.
   */
  private settingsOf(settings: JobSettings): number {
    const own = (): number => this.settingsList.push(settings) - 1;
    if (settings.lease !== this.ownerOnlyLease || typeof settings.catchUp === 'object')
      return own();
    // Compared field by field, newest first: no key string made per registration.
    for (let i = this.sharedSettings.length - 1; i >= 0; i--) {
      const index = this.sharedSettings[i] as number;
      if (sameSettings(this.settingsList[index] as JobSettings, settings)) return index;
    }
    const index = own();
    if (this.sharedSettings.length < MAX_SHARED_SETTINGS) {
      Object.freeze(settings);
      this.sharedSettings.push(index);
    }
    return index;
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

  /**
   * Starts firing ticks. The ledger tables must exist (`locks.migrate()`). First registers each
   * job's schedule in the ledger (refreshed every minute) and reports a `schedule-conflict` for a
   * job that another live instance registered under a different schedule. A database that cannot
   * be reached does not make start() fail: the ticks report `error` events, and the registrations
   * are retried a minute later.
   */
  async start(): Promise<void> {
    if (this.stopping.signal.aborted)
      throw new LockkitError('OPTION_INVALID', 'a stopped scheduler cannot start again.');
    if (this.started) return;
    this.started = true;
    // A database that is down at start-up is reported by the ticks' `error` events; the
    // registrations are retried with the next heartbeat.
    const initial = this.names.size;
    this.announced = await this.announce(0, initial).then(
      () => true,
      () => false,
    );
    // stop() while start() waited: it has cleared what start() had not armed yet, so arm nothing
    // more (a timer armed now would run the stopped scheduler's heartbeats and prunes for ever).
    if (this.stopping.signal.aborted) return;
    if (this.announced) this.announcedUpTo(initial);
    // Owned distribution: a member only once its registrations are in (the others read them when
    // it joins); until its first beat its view is stale, and it decides every job.
    if (this.membership !== undefined) {
      await this.beat();
      if (this.stopping.signal.aborted) return;
      this.membershipTimer = setInterval(
        () => void this.beat(),
        this.membership.settings.heartbeatMs,
      );
      this.membershipTimer.unref();
    }
    this.scheduleTogether();
    this.heartbeatTimer = setInterval(() => void this.heartbeat().catch(() => {}), HEARTBEAT_MS);
    this.heartbeatTimer.unref();
    if (this.retentionMs > 0) {
      this.pruneTimer = setInterval(
        () => void this.prune(),
        Math.min(Math.max(this.retentionMs / 2, MIN_PRUNE_INTERVAL_MS), MAX_PRUNE_INTERVAL_MS),
      );
      this.pruneTimer.unref();
    }
  }

  /**
   * Stops firing new ticks, aborts the signal of running tasks, and waits up to `timeoutMs`
   * (default 30 s; an integer from 0 to 2^31 − 1, else `OPTION_INVALID` and nothing is stopped)
   * for them to end — and no longer in all, its own clean-up query included. A run
   * that ends by throwing on that signal gives its tick back (PENDING in the ledger, the attempt
   * not counted): the next instance runs it — unless its transaction-mode handler committed the
   * tick's transaction itself first (`LOCK_NOT_HELD`: recorded FAILED, never run again). Pending retries
   * stay in the ledger for other instances. Resolves with how many runs were still going when the
   * time ran out.
   */
  async stop(
    options: { readonly timeoutMs?: number } = {},
  ): Promise<{ readonly stillRunning: number }> {
    // Checked first: a value setTimeout cannot wait (Infinity, 2^31 ms or more) would end the
    // wait at once and report runs still going as if the time had run out.
    const timeoutMs = checkMilliseconds(options?.timeoutMs ?? 30_000, 'stop(): timeoutMs', 0);
    this.stopping.abort(new LockkitError('ABORTED', 'the scheduler is stopping'));
    this.timers.stopAll();
    for (const timer of this.retryTimers) timer.cancel();
    this.retryTimers.clear();
    for (const { timer } of this.followUps.values()) timer.cancel();
    this.followUps.clear();
    for (const timer of this.holderWatches.values()) timer.cancel();
    this.holderWatches.clear();
    for (const timer of this.owedWatches.values()) timer.cancel();
    this.owedWatches.clear();
    clearInterval(this.pruneTimer);
    clearInterval(this.heartbeatTimer);
    clearInterval(this.membershipTimer);
    // Owned distribution: this instance decides nothing from now on, so it leaves now, not after
    // its running tasks end, and its successors take its jobs over at their next beat. They owe
    // its jobs' ticks from the oldest it was still firing (a tick waiting for the job's lock, for
    // `claimTimeoutMs`, is given up now, undecided), or from this instant: a run still going
    // holds its own tick's lock meanwhile, and a successor leaves that tick to it.
    let oldestFiring = this.now();
    for (const at of this.firing.keys()) oldestFiring = Math.min(oldestFiring, at);
    const left = this.started ? this.membership?.leave(oldestFiring).catch(() => {}) : undefined;
    const deadline = Date.now() + timeoutMs;
    const until = (ms: number) =>
      new Promise<'timeout'>((resolve) => setTimeout(resolve, ms, 'timeout').unref());
    const all = Promise.allSettled([...this.running]);
    const timeout = until(deadline - Date.now());
    const stillRunning = (await Promise.race([all, timeout])) === 'timeout' ? this.running.size : 0;
    // The clean-up gets what is left of timeoutMs: a database that stopped answering (or a pool
    // used up by a stuck run) must not hold stop() for ever; an entry left behind stops counting
    // as live once its heartbeat is old.
    if (this.started) {
      const cleanUp = Promise.all([
        left,
        this.query((q) => this.ledger.deregister(q)).catch(() => {}),
      ]);
      await Promise.race([cleanUp, until(Math.max(0, deadline - Date.now()))]);
    }
    return { stillRunning };
  }

  /**
   * Runs one tick of a registered job now, exactly as its timer would (claim, catch-up, run,
   * record, then any PENDING ticks that are due), and resolves when this node is done with it.
   * For tests and operators: ticks fire without waiting for the clock. Rejects with
   * `OPTION_INVALID` for an unknown job, or for a tick that is not a valid Date on the job's
   * schedule (a tick the schedule never produces would get a ledger row of its own, and skew
   * catch-up and retention); infrastructure failures are `error` events, as for timed ticks.
   * Rejects with `NESTED_CALL` for a tick this scheduler is deciding or running now — from that
   * tick's own handler the call could never resolve. A tick older than what pruning keeps (see
   * `retentionMs`), with no ledger row, rows after it and none before, is taken for pruned and
   * reported `skipped-done`, not run.
   */
  async runTick(name: string, tick: Date): Promise<void> {
    const row = typeof name === 'string' ? this.rowOf(name) : -1;
    if (row < 0) throw new LockkitError('OPTION_INVALID', `no job "${name}" is registered.`);
    const at = tick instanceof Date ? tick.getTime() : Number.NaN;
    if (!Number.isFinite(at)) {
      throw new LockkitError('OPTION_INVALID', `job "${name}": the tick must be a valid Date.`);
    }
    const schedule = this.jobSchedules[row] as number;
    if (this.schedules.nextRun(schedule, at - 1) !== at) {
      throw new LockkitError(
        'OPTION_INVALID',
        `job "${name}": ${tick.toISOString()} is not a tick of its schedule "${this.schedules.expression(schedule)}".`,
      );
    }
    // This scheduler is deciding or running that very tick now. From inside its own handler a
    // call could never resolve (it would wait for the run that waits for it, while the job's lock
    // stays held on every node); from anywhere else it would only wait for what is under way here.
    if (this.deciding.has(`${row}:${at}`)) {
      throw new LockkitError(
        'NESTED_CALL',
        `job "${name}": its tick ${tick.toISOString()} is being decided or run on this scheduler now; runTick resolves when this node is done with a tick, which from inside that tick's own handler would be never. Wait for its 'ran', 'failed' or 'skipped-done' event instead.`,
      );
    }
    const job = this.jobAt(row);
    const work = this.fire(job, tick);
    this.track(work);
    await work;
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

  /** Fires the ticks of the job of `row` from now on (see {@link TickTimers}: capped sleeps, jitter-safe). */
  private schedule(row: number): void {
    if (this.stopping.signal.aborted) return;
    const settings = this.settingsList[this.jobSettings[row] as number] as JobSettings;
    const timer = this.timers.add(this.jobSchedules[row] as number, row, settings.jitterMs);
    this.jobTimers[row] = timer;
    this.timers.start(timer);
  }

  /**
   * Fires the ticks of every job not yet timed (one registered while `start()` was announcing
   * already is) from now on. Jobs without jitter on one schedule, registered one after the other
   * and started at one instant, would have timers that agree in everything: they share one, which
   * fires each job's tick in registration order, as their own timers did from one queue. A
   * jittered job draws its own jitter at each tick, and a job alone in its run (distinct
   * schedules, or schedules registered in turn) keeps a timer of its own; runs rather than a map
   * by schedule, so that 10,000 distinct schedules build no map at start. A timer is a row of
   * {@link Scheduler.timers}, not an object (see {@link TickTimers}).
   */
  private scheduleTogether(): void {
    if (this.stopping.signal.aborted) return;
    // The run: jobs runFrom.. (those of them not timed yet and without jitter) on runSchedule.
    let run: number[] = [];
    const flush = (): void => {
      const [first] = run;
      if (run.length === 1 && first !== undefined) this.schedule(first);
      else if (first !== undefined) {
        const subject = -1 - this.runs.length;
        this.runs.push(Int32Array.from(run));
        const timer = this.timers.add(this.jobSchedules[first] as number, subject, 0);
        for (const row of run) this.jobTimers[row] = timer;
        this.timers.start(timer);
      }
      run = [];
    };
    for (let row = 0; row < this.names.size; row++) {
      if (this.jobTimers[row] !== -1) continue;
      const settings = this.settingsList[this.jobSettings[row] as number] as JobSettings;
      if (settings.jitterMs !== 0) {
        this.schedule(row);
        continue;
      }
      const first = run[0];
      if (first !== undefined && this.jobSchedules[first] !== this.jobSchedules[row]) flush();
      run.push(row);
    }
    flush();
  }

  private track(work: Promise<void>): void {
    this.running.add(work);
    void work.finally(() => this.running.delete(work));
  }

  /** One ledger transaction outside the job's lock (drain, judge, give back): failures typed. */
  private query<T>(fn: (query: QueryFn) => Promise<T>): Promise<T> {
    return ownTransaction(this.locks.executor, 'scheduler ledger', fn);
  }

  /**
   * Registers `jobs` in the ledger's schedules table and reports conflicting registrations: a
   * transaction of two statements per {@link ANNOUNCE_BATCH} jobs, not one a job (10,000 jobs
   * made 10,000 transactions at start, whose garbage grew the process by ~10 MB).
   */
  private async announce(from: number, to: number): Promise<void> {
    for (let first = from; first < to; first += ANNOUNCE_BATCH) {
      const end = Math.min(to, first + ANNOUNCE_BATCH);
      const rows = registrationRows(first, end, (row, into) => {
        const schedule = this.jobSchedules[row] as number;
        into.job = this.names.get(row);
        into.cron = this.schedules.expression(schedule);
        into.timezone = (
          this.settingsList[this.jobSettings[row] as number] as JobSettings
        ).timezone;
        into.hash = this.schedules.hash(schedule);
      });
      // Owned distribution: the first batch of a whole announcement replaces what this owner id
      // registered before (a process restarted under a fixed owner may have other jobs now: the
      // others must not count it for the jobs it dropped).
      const replacing = this.membership !== undefined && first === 0 && to === this.names.size;
      const conflicting = await this.query(async (q) => {
        if (replacing) await this.ledger.deregister(q);
        return this.ledger.registerMany(q, rows);
      });
      // Usually none: then no job of the batch has a conflict to report or to clear.
      if (conflicting.size === 0 && this.conflicts.size === 0) continue;
      for (let row = first; row < end; row++)
        this.reportConflict(row, conflicting.get(this.names.get(row)) ?? []);
    }
  }

  /** Refreshes the registrations (or makes them, if start() could not) and looks for conflicts. */
  private async heartbeat(): Promise<void> {
    if (!this.announced) {
      const all = this.names.size;
      await this.announce(0, all);
      this.announced = true;
      this.announcedUpTo(all);
      return;
    }
    const conflicted = await this.query(async (q) => {
      await this.ledger.heartbeat(q);
      return this.ledger.conflictedJobs(q);
    });
    for (let row = 0; row < this.names.size; row++) {
      if (!conflicted.has(this.names.get(row))) this.conflicts.delete(row);
      else {
        const job = this.jobAt(row);
        this.reportConflict(row, await this.query((q) => this.ledger.registrations(q, job)));
      }
    }
  }

  private reportConflict(
    row: number,
    live: readonly { owner: string; cron: string; timezone: string; hash: string }[],
  ): void {
    if (live.length === 0 && !this.conflicts.has(row)) return; // nothing to compare, none reported
    const hashes = new Set(live.map((r) => r.hash));
    const signature = hashes.size > 1 ? [...hashes].sort().join(',') : undefined;
    if (signature !== undefined && signature !== this.conflicts.get(row)) {
      this.emit({
        type: 'schedule-conflict',
        job: this.names.get(row),
        schedules: live.map(({ owner, cron, timezone }) => ({ owner, cron, timezone })),
      });
    }
    if (signature === undefined) this.conflicts.delete(row);
    else this.conflicts.set(row, signature);
  }

  /**
   * Every job below `rows` is announced (unless a late one is still in flight): owned
   * distribution reads the registrations again at the next beat, so that the others' owners of
   * those jobs and this instance's agree.
   */
  private announcedUpTo(rows: number): void {
    if (this.lateAnnouncements > 0 || rows <= this.announcedRows) return;
    this.announcedRows = rows;
    this.membership?.rereadRegistrations();
  }

  /**
   * Owned distribution: whether this instance decides `job` now — it owns it, or cannot tell (its
   * view is stale, or the job was registered after the registrations were last read).
   */
  private decides(job: Job<Tx>): boolean {
    const membership = this.membership;
    if (membership === undefined || job.row >= this.registrationsReadFor) return true;
    return membership.view.decides(job.name, this.now());
  }

  /**
   * Owned distribution: one heartbeat, then the ticks now owed held for the jobs that came here
   * from a member that went. A failed beat is not reported (the view grows stale, and this
   * instance then decides every job).
   */
  private async beat(): Promise<void> {
    const membership = this.membership;
    if (membership === undefined || this.stopping.signal.aborted) return;
    try {
      await membership.beat();
    } catch {
      return;
    }
    // Synchronously after the view changed: no tick timer runs before `owing` says what waits.
    this.holdOwedTicks(membership);
    void membership.prune().catch(() => {});
  }

  /**
   * Owned distribution: who among the live members registered which job, read when the live
   * members change (before the view uses them). Until that read succeeds, jobs registered here
   * are decided here.
   */
  private async readRegistrations(live: ReadonlySet<string>): Promise<void> {
    // Only the jobs announced by now are in what the others read of this instance.
    const known = this.announced ? this.announcedRows : 0;
    const statement = partialRegistrationsStatement(
      { schema: this.schema, namespace: this.ledgerNamespace },
      JSON.stringify([...live]),
    );
    const rows = await this.query((q) => q(statement.text, statement.params));
    const partial = new Map<string, ReadonlySet<string>>();
    for (const row of rows) {
      partial.set(String(row.job), new Set(JSON.parse(String(row.owners)) as string[]));
    }
    this.partialRegistrations = partial;
    this.registrationsReadFor = known;
  }

  /**
   * Owned distribution: for every job this instance now owes ticks of (its owner went; see
   * {@link MembershipView.owedFrom}), holds the ticks of its schedule from that instant (less the
   * grace for skew) to now that have no ledger row, PENDING and due at once, then drains them.
   * The job's timer waits for this; a failure leaves the debt owed for the next beat.
   */
  private holdOwedTicks(membership: SchedulerMembership): void {
    const now = this.now();
    for (let row = 0; row < this.names.size; row++) {
      if (this.owing.has(row)) continue;
      const name = this.names.get(row);
      const from = membership.view.owedFrom(name);
      if (from === undefined) continue;
      const job = this.jobAt(row);
      const schedule = this.jobSchedules[row] as number;
      const ticks: Date[] = [];
      let at = this.schedules.nextRun(
        schedule,
        Math.max(from, now - MAX_OWED_MS) - this.graceMs - 1,
      );
      while (Number.isFinite(at) && at <= now && ticks.length < MAX_CATCH_UP) {
        ticks.push(new Date(at));
        at = this.schedules.nextRun(schedule, at);
      }
      const holding = (async () => {
        try {
          await this.holdOwed(job, ticks, now);
        } catch {
          membership.view.unpaid(name);
        } finally {
          this.owing.delete(row);
        }
      })();
      this.owing.set(row, holding);
    }
  }

  /**
   * Holds owed `ticks` of `job` (see {@link Ledger.holdOwed}) and drains those held. Those left to
   * a run still going are looked at again every `claimTimeoutMs` (see {@link owedBusy}): once the
   * run is over, its tick has a row (it committed) or is held and run here (it died).
   */
  private async holdOwed(job: Job<Tx>, ticks: readonly Date[], now: number): Promise<void> {
    const keyed = ticks.map((tick) => ({ tick, key: this.tickKey(job, tick) }));
    const { held, busy } = await this.query((q) =>
      this.ledger.holdOwed(q, job, keyed, new Date(now)),
    );
    const waiting = this.owedBusy.get(job.row) ?? new Set<number>();
    for (const tick of ticks) waiting.delete(tick.getTime());
    for (const tick of busy) waiting.add(tick.getTime());
    if (waiting.size > 0) {
      this.owedBusy.set(job.row, waiting);
      this.watchOwed(job);
    } else this.owedBusy.delete(job.row);
    // A failure is reported as fire() reports one; never an unhandled rejection.
    if (held.length > 0)
      this.track(
        this.drain(job).catch((error: unknown) => {
          if (!this.stopping.signal.aborted)
            this.emit({ type: 'error', job: job.name, tick: held[0] as Date, error });
        }),
      );
  }

  /** Looks at the job's {@link owedBusy} ticks again after `claimTimeoutMs` (one timer a job). */
  private watchOwed(job: Job<Tx>): void {
    if (this.stopping.signal.aborted || this.owedWatches.has(job.row)) return;
    const timer = this.clock.setTimer(job.settings.claimTimeoutMs, () => {
      if (this.owedWatches.get(job.row) === timer) this.owedWatches.delete(job.row);
      const waiting = this.owedBusy.get(job.row);
      if (this.stopping.signal.aborted || waiting === undefined) return;
      const ticks = [...waiting].map((ms) => new Date(ms));
      this.track(this.holdOwed(job, ticks, this.now()).catch(() => this.watchOwed(job)));
    });
    this.owedWatches.set(job.row, timer);
  }

  /** The job's lock key, made at its first tick and kept (see {@link Job.key}). */
  private keyOf(job: Job<Tx>): LockKey {
    job.key ??= jobKey(this.lockNamespace, job.name);
    return job.key;
  }

  /** The lock of one tick, held by whoever runs it (see {@link Ledger.holders}). */
  private tickKey(job: Job<Tx>, tick: Date): LockKey {
    // A flat 24-character string, not a slice holding on to the whole 64-character digest.
    job.nameHash ??= createHash('sha256').update(job.name).digest().toString('hex', 0, 12);
    return LockKey.fromNames(`${this.lockNamespace}#tick`, `${job.nameHash}@${tick.toISOString()}`);
  }

  /**
   * One tick on this node, then the missed ticks catch-up chose to run, then — when this node ran
   * something — every PENDING tick of the job that is due (queued ticks, retries, ticks given
   * back), oldest first.
   */
  private async fire(job: Job<Tx>, tick: Date): Promise<void> {
    const at = tick.getTime();
    countIn(this.firing, at, 1);
    try {
      if (this.membership !== undefined) {
        // Ticks the job's last owner left are held first: no catch-up may judge them holes.
        await this.owing.get(job.row);
        if (!this.decides(job)) return;
      }
      const outcome = await this.runOne(job, tick, 'timer');
      let drain = outcome.drain;
      for (const missedTick of outcome.catchUp) {
        if (this.stopping.signal.aborted) return;
        drain = (await this.runOne(job, missedTick, 'catch-up')).drain || drain;
      }
      if (drain) await this.drain(job);
    } catch (error) {
      // A stop's aborts are not reported; a handler that ended the tick's transaction itself is,
      // stopping or not (its work may be committed, the tick recorded FAILED).
      if (!this.stopping.signal.aborted || error instanceof LockNotHeldError)
        this.emit({ type: 'error', job: job.name, tick, error });
    } finally {
      countIn(this.firing, at, -1);
    }
  }

  /**
   * Runs the job's PENDING ticks that are due, oldest first, until none is or one is not ours. A
   * PENDING tick left because it is not yet due on this node's clock (a retry's delay; a tick
   * queued by a node whose clock runs ahead, due at its own time) gets a follow-up here at its due
   * time: this node may be the last to look at it, and nobody else would before the job fires again.
   *
   * One pass a job at a time on this node. A drain asked for while a pass runs is served by one
   * more pass, started when the running one ends, and resolves with it; every later request while
   * that pass waits joins it. Runs that end while a pass waits on the job's lock (a loaded machine)
   * would otherwise each start one, all at the same oldest tick; all but one find it done after
   * their wait, and the ticks behind it starve. Each pass's failure reaches the caller that asked
   * for it, who reports it with its own tick; callers that joined get it quietly.
   */
  private drain(job: Job<Tx>): Promise<void> {
    const running = this.draining.get(job.name);
    if (running !== undefined) {
      if (running.next !== undefined) return running.next.catch(() => {});
      // Its map entry is gone by then (removed as the pass settles, before this reaction runs).
      running.next = running.done.then(
        () => this.drain(job),
        () => this.drain(job),
      );
      return running.next;
    }
    const pass: { done: Promise<void>; next?: Promise<void> } = { done: Promise.resolve() };
    this.draining.set(job.name, pass);
    pass.done = this.drainOnce(job).finally(() => {
      if (this.draining.get(job.name) === pass) this.draining.delete(job.name);
    });
    return pass.done;
  }

  /** One drain's pass: see {@link drain}. */
  private async drainOnce(job: Job<Tx>): Promise<void> {
    const tried = new Set<number>();
    while (!this.stopping.signal.aborted) {
      const next = await this.query((q) => this.ledger.nextPending(q, job, new Date(this.now())));
      if (next === undefined) return;
      if (!next.due) {
        this.followUp(job, next.retryAt);
        return;
      }
      const due = next.tick;
      if (tried.has(due.getTime())) return;
      tried.add(due.getTime());
      if (!(await this.runOne(job, due, 'pending')).drain) return;
    }
  }

  /**
   * Drains the job again at `at` (this node's clock), unless a follow-up is already set for then or
   * earlier: the drain it runs sets the next one.
   */
  private followUp(job: Job<Tx>, at: Date): void {
    if (this.stopping.signal.aborted) return;
    const existing = this.followUps.get(job.name);
    if (existing !== undefined && existing.at <= at.getTime()) return;
    existing?.timer.cancel();
    const delay = Math.min(MAX_TIMER_MS, Math.max(0, at.getTime() - this.now()));
    const timer = this.clock.setTimer(delay, () => {
      if (this.followUps.get(job.name)?.timer === timer) this.followUps.delete(job.name);
      this.track(
        this.drain(job).catch((error: unknown) => {
          if (!this.stopping.signal.aborted)
            this.emit({ type: 'error', job: job.name, tick: at, error });
        }),
      );
    });
    this.followUps.set(job.name, { at: at.getTime(), timer });
  }

  /**
   * After this node queued a tick (committed) because another tick's run held the job: whether the
   * job is free now, so that this node must run the queue itself. The run it queued behind may have
   * ended and looked for due ticks before the queued one committed (a lost wake-up: nobody would run
   * it before the job fires again). If the job is still held, its holder looks after it lets go —
   * after the queued tick committed: a transaction-mode holder of the job's lock drains when it
   * ends (see runInTransaction: a queue job's tick found done drains too); a lease's holder drains
   * after recording its run's end.
   */
  private async jobFreeAfterQueuing(job: Job<Tx>): Promise<boolean> {
    if (this.stopping.signal.aborted) return false;
    const free = await this.jobFree(job);
    if (!free) this.watchHolder(job);
    return free;
  }

  /** Whether nobody holds the job: its lock (transaction mode) or its lease (lease mode). */
  private async jobFree(job: Job<Tx>): Promise<boolean> {
    if (job.settings.mode === 'lease')
      return !(await this.query((q) => this.ledger.leaseHeld(q, job)));
    const tried = await this.locks.withLock(this.keyOf(job), async () => undefined, {
      signal: this.stopping.signal,
      statementTimeoutMs: 0,
    });
    return tried.executed;
  }

  /**
   * After this node queued a tick behind a run it found holding the job: looks again every
   * `claimTimeoutMs` (this node's clock) while the job's queue has a PENDING tick, and runs the
   * queue once the job is free. The holder looks when it lets go, but not always: a holder that is
   * stopping, whose run ended in an error, or whose process died does not — and the queued tick
   * would wait for the job's next firing, an interval later.
   */
  private watchHolder(job: Job<Tx>): void {
    if (this.stopping.signal.aborted || this.holderWatches.has(job.name)) return;
    const timer = this.clock.setTimer(job.settings.claimTimeoutMs, () => {
      if (this.holderWatches.get(job.name) === timer) this.holderWatches.delete(job.name);
      if (this.stopping.signal.aborted) return;
      this.track(
        (async () => {
          const now = new Date(this.now());
          if ((await this.query((q) => this.ledger.nextPending(q, job, now))) === undefined) return;
          if (await this.jobFree(job)) await this.drain(job);
          else this.watchHolder(job);
        })().catch((error: unknown) => {
          if (!this.stopping.signal.aborted)
            this.emit({ type: 'error', job: job.name, tick: new Date(this.now()), error });
        }),
      );
    });
    this.holderWatches.set(job.name, timer);
  }

  /**
   * One attempt at `tick`: fired by its `timer` (then catch-up judges the ticks before it), run by
   * `catch-up`, or a `pending` tick of the ledger (queued, a retry, given back).
   */
  private runOne(job: Job<Tx>, tick: Date, how: TickSource): Promise<TickOutcome> {
    const key = `${job.row}:${tick.getTime()}`;
    countIn(this.deciding, key, 1);
    const attempt =
      job.settings.mode === 'transaction'
        ? this.runInTransaction(job, tick, how)
        : this.runInLease(job, tick, how);
    return attempt.finally(() => countIn(this.deciding, key, -1));
  }

  /** How long after its tick a run starts, on this scheduler's clock. */
  private lateMs(tick: Date): number {
    return Math.max(0, this.now() - tick.getTime());
  }

  /** The run's signal: the connection's or lease's, the job timeout, and stop(). */
  private runSignal(job: Job<Tx>, base: AbortSignal): AbortSignal {
    const signals = [base, this.stopping.signal];
    if (job.settings.timeoutMs !== undefined)
      signals.push(AbortSignal.timeout(job.settings.timeoutMs));
    return AbortSignal.any(signals);
  }

  /** How a failed attempt is recorded: for a retry after `retryDelayMs`, or for good. */
  private failure(job: Job<Tx>, attempt: number, error: string): RunRecord {
    return attempt < job.settings.maxAttempts
      ? { kind: 'retry', error, retryAt: new Date(this.now() + job.settings.retryDelayMs) }
      : { kind: 'failed', error };
  }

  /** Fires `tick` again when its retry is due, on the scheduler's clock (other nodes find it in the ledger too). */
  private retryLater(job: Job<Tx>, tick: Date, record: RunRecord): void {
    if (record.kind !== 'retry' || this.stopping.signal.aborted) return;
    const timer = this.clock.setTimer(Math.max(0, record.retryAt.getTime() - this.now()), () => {
      this.retryTimers.delete(timer);
      this.track(this.fire(job, tick));
    });
    this.retryTimers.add(timer);
  }

  /**
   * Records FAILED a tick whose transaction-mode handler committed the tick's transaction itself
   * and whose failure record was never written (see the `self-committed` tick state): the same
   * record its own node writes, under the job's lock. Not run again: its work may be committed.
   * Whether there was such a row to record (a tick whose transaction rolled back has none).
   */
  private async recordSelfCommitted(query: QueryFn, job: Job<Tx>, tick: Date): Promise<boolean> {
    return this.ledger.finish(query, job, tick, null, selfCommittedRecord(job));
  }

  /**
   * Records FAILED the ticks catch-up found left RUNNING by a handler's own COMMIT (see
   * {@link Ledger.findHoles}), each in a transaction of its own after the tick's: written inside
   * it, the update held the other node's row for the whole of this node's run, and that node's
   * own FAILED write of the same tick waited as long. Outside the job's lock, and safe so (see
   * {@link recordLater}); one that cannot be written now is written later.
   */
  private async repairSelfCommitted(job: Job<Tx>, ticks: readonly Date[]): Promise<void> {
    for (const tick of ticks) {
      await this.query((q) => this.recordSelfCommitted(q, job, tick)).catch(() => {
        this.recordLater(
          job,
          tick,
          selfCommittedRecord(job),
          Math.max(job.settings.retryDelayMs, 100),
        );
      });
    }
  }

  /**
   * Writes a self-committed tick's FAILED record (see {@link recordSelfCommitted}) that could not
   * be written at once: again after `delayMs` on the scheduler's clock, then after twice that, up
   * to a minute apart, until it is written or the scheduler stops. Outside the job's lock, and
   * safe so: the row only goes from RUNNING to FAILED (nobody runs a self-committed tick again).
   */
  private recordLater(job: Job<Tx>, tick: Date, record: RunRecord, delayMs: number): void {
    if (this.stopping.signal.aborted) return;
    const timer = this.clock.setTimer(delayMs, () => {
      this.retryTimers.delete(timer);
      this.track(
        this.query((q) => this.ledger.finish(q, job, tick, null, record)).then(
          () => {},
          () => this.recordLater(job, tick, record, Math.min(delayMs * 2, 60_000)),
        ),
      );
    });
    this.retryTimers.add(timer);
  }

  /**
   * After the wait for the job's lock timed out: who holds it? A run of this very tick (its tick
   * lock is taken: `again`, wait for its outcome), or a transaction that holds the job's lock
   * together with another tick's lock — a run (or, in lease mode, a claim) of another tick: an
   * overlap, recorded SKIPPED_OVERLAP or queued PENDING per the job's policy. Anything else is
   * `again` too: the job's lock is free by now, or its holder shows no tick of its own — which is
   * what a run of THIS tick looks like between its two lock statements (the job's lock granted,
   * the tick's not yet asked: one round trip, longer behind a pooler), and what a dying run looks
   * like when Postgres has freed its tick lock a moment before its job lock. Skipping on that sight
   * lost the tick (issue 24): the live runner then found it SKIPPED, the dead one ran nothing.
   *
   * Why not the other order for runners (tick lock, then job lock), which would make "the job's
   * lock held, the tick's free" mean another tick? Nodes firing one tick would then queue on the
   * tick's lock and, while an earlier tick's long run holds the job, time out and judge each other
   * ('again') for the whole of that run. The judge here needs no order change and no schema
   * change: the proof is read from `pg_locks` (by `virtualtransaction`, never by pid), with the
   * tick's lock already held by the judge so that no run of this tick can start meanwhile.
   */
  private async whenHeld(job: Job<Tx>, tick: Date): Promise<HeldDecision> {
    const tickKey = this.tickKey(job, tick);
    return this.query(async (q) => {
      const { tickFree, anotherTickRuns } = await this.ledger.judge(q, this.keyOf(job), tickKey);
      if (!tickFree || !anotherTickRuns) return 'again';
      // A decision later than the look-back may find its tick's row pruned: done, as under the
      // job's lock (see Ledger.state). Queued or recorded skipped, it would run again or lie.
      const state = await this.tickState(q, job, tick, new Date(this.now()));
      if (state.kind === 'pruned') return 'exists';
      return this.overlapped(job, tick, q);
    });
  }

  /** Records an overlapping tick per the job's policy (inside a transaction). */
  private async overlapped(job: Job<Tx>, tick: Date, query: QueryFn): Promise<HeldDecision> {
    if (job.settings.overlap === 'queue')
      return this.ledger.queue(query, job, tick, new Date(this.now()), job.settings.queueLimit);
    return (await this.ledger.recordSkipped(query, job, tick)) ? 'skipped' : 'exists';
  }

  /**
   * With `overlap: 'queue'`, a tick its timer fired while older queued ticks are due waits
   * behind them (queued PENDING now, or left PENDING if another node queued it meanwhile; whoever
   * runs next takes them oldest first): undefined when it need not, else what became of it.
   */
  private async queueBehind(
    job: Job<Tx>,
    tick: Date,
    how: TickSource,
    state: TickState,
    query: QueryFn,
    now: Date,
  ): Promise<HeldDecision | undefined> {
    if (job.settings.overlap !== 'queue' || how !== 'timer') return undefined;
    if (state.kind !== 'free' && state.kind !== 'due') return undefined;
    const due = await this.ledger.nextDue(query, job, now);
    if (due === undefined || due.getTime() >= tick.getTime()) return undefined;
    // Queued already (another node queued it while this one waited for the job): it waits there.
    if (state.kind === 'due') return 'queued';
    return this.ledger.queue(query, job, tick, now, job.settings.queueLimit);
  }

  /** Reports the ticks a committed catch-up recorded MISSED. */
  private reportMissed(job: Job<Tx>, missed: readonly Date[]): void {
    if (missed.length > 0) this.emit({ type: 'missed', job: job.name, ticks: missed });
  }

  /** Reports what became of an overlapping tick. */
  private reportHeld(job: Job<Tx>, tick: Date, decision: HeldDecision): void {
    if (decision === 'skipped') this.emit({ type: 'skipped-held', job: job.name, tick });
    else if (decision === 'full') this.emit({ type: 'queue-full', job: job.name, tick });
    else if (decision === 'exists') this.emit({ type: 'skipped-done', job: job.name, tick });
  }

  /**
   * Inside the job's lock: the ticks of the job's current schedule up to the grace horizon that
   * nobody ran (see {@link Ledger.findHoles}), recorded MISSED per policy (added to `missed`, to
   * report once the transaction commits); returns those to run, held for them. Adds to
   * `selfCommitted` the recent ticks a handler's own COMMIT left RUNNING with nobody to record
   * them (for {@link Scheduler.repairSelfCommitted}, after the transaction).
   */
  private async catchUp(
    job: Job<Tx>,
    tick: Date,
    query: QueryFn,
    missed: Date[],
    selfCommitted: Date[],
  ): Promise<Date[]> {
    // In lease mode with overlap 'skip', a node that fired a tick (up to jitterMs late) may still
    // be waiting for an earlier run's lease, up to claimTimeoutMs, with no row for it yet: not a
    // hole until then.
    const waitingMs =
      job.settings.mode === 'lease' && job.settings.overlap === 'skip'
        ? job.settings.jitterMs + job.settings.claimTimeoutMs
        : 0;
    // Owned distribution: a tick whose owner died is owed to its successor once the owner's row
    // expires and a beat sees it (a TTL and a beat after its last beat): not a hole before then,
    // even here, where the job may have come by another member's joining meanwhile.
    const handOverMs =
      this.membership === undefined
        ? 0
        : this.membership.settings.ttlMs + this.membership.settings.heartbeatMs;
    const horizon = new Date(
      Math.min(tick.getTime() - 1, this.now() - this.graceMs - waitingMs - handOverMs),
    );
    const found = await this.ledger.findHoles(query, job, job.cron, horizon);
    // Ticks a handler committed itself, left RUNNING by a node that could not record them FAILED:
    // recorded once this tick's transaction is over (see repairSelfCommitted), never run again.
    selfCommitted.push(...found.selfCommitted);
    // Owed ticks left to a run still going are this node's to hold once it is over, not holes.
    const busy = this.owedBusy.get(job.row);
    const holes =
      busy === undefined ? found.holes : found.holes.filter((t) => !busy.has(t.getTime())); // newest first
    if (holes.length === 0) return [];
    let run: Date[] = [];
    if (job.settings.catchUp === 'latest') {
      // The newest hole, unless a later tick has run (or waits to) since: the job is then up to
      // date, and one outage gives one catch-up run even when a hole leaves the grace window only
      // after the outage's first tick ran.
      const newest = holes[0] as Date;
      if (!(await this.ledger.ranAfter(query, job, newest))) run = [newest];
    } else if (typeof job.settings.catchUp === 'object') {
      const since = tick.getTime() - job.settings.catchUp.withinMs;
      run = holes.filter((t) => t.getTime() >= since).reverse();
    }
    const recorded = await this.ledger.recordMissed(
      query,
      job,
      holes.filter((t) => !run.includes(t)),
    );
    missed.push(...recorded);
    // Held PENDING in the same transaction: a tick judging before they run (this node runs them
    // after its own) finds them taken, not holes; if this node dies first, they are due for
    // whoever runs the job next.
    return this.ledger.holdForCatchUp(query, job, run, new Date(this.now()));
  }

  private async runInTransaction(job: Job<Tx>, tick: Date, how: TickSource): Promise<TickOutcome> {
    const tickLock = lockStatement(this.tickKey(job, tick), 'transaction', 'exclusive', true);
    const handlerTimeout = job.settings.timeoutMs ?? this.locks.statementTimeoutMs;
    for (;;) {
      // Ticks catch-up recorded MISSED: reported once (if) the transaction commits.
      const missed: Date[] = [];
      const selfCommitted: Date[] = [];
      const started = performance.now();
      let claimed = false;
      let outcome:
        | { kind: 'done'; catchUp: Date[] }
        | { kind: 'behind'; decision: HeldDecision; catchUp: Date[] }
        | { kind: 'ran'; attempt: number; catchUp: Date[] }
        | { kind: 'failed'; attempt: number; error: unknown; record: RunRecord; catchUp: Date[] };
      try {
        const r = await this.locks.withLock(
          this.keyOf(job),
          async (tx, ctx) => {
            await ctx.query(tickLock.text, tickLock.params);
            const now = new Date(this.now());
            const state = await this.tickState(ctx.query, job, tick, now);
            if (state.kind === 'self-committed') {
              await this.recordSelfCommitted(ctx.query, job, tick);
              return { kind: 'done' as const, catchUp: [] };
            }
            if (state.kind !== 'free' && state.kind !== 'due')
              return { kind: 'done' as const, catchUp: [] };
            // Before catch-up: the ticks catch-up holds for itself are not a queue to wait behind.
            const behind = await this.queueBehind(job, tick, how, state, ctx.query, now);
            // A timer's tick judges the ticks before it; so does a queued (or retried, or given
            // back) tick drained from the ledger: queued ticks run oldest first, so the first to
            // run after an earlier run died judges that run's tick (no row) before the queued
            // rows, run, outnumber the rows catch-up anchors on.
            const catchUp =
              (state.kind === 'free' && how === 'timer') ||
              (state.kind === 'due' && how === 'pending' && !state.catchUp)
                ? await this.catchUp(job, tick, ctx.query, missed, selfCommitted)
                : [];
            if (behind !== undefined) return { kind: 'behind' as const, decision: behind, catchUp };
            const attempt = await this.ledger.claim(ctx.query, job, tick, null, now);
            if (attempt === undefined) return { kind: 'done' as const, catchUp };
            claimed = true;
            // From here on the handler's own bound applies, not the claim's.
            await ctx.query(RUN_SETTINGS, [
              handlerTimeout === undefined ? null : String(handlerTimeout),
            ]);
            // The job's own work rolls back to here on failure; the claim and its record commit.
            await ctx.query(SAVEPOINT);
            try {
              await job.handler({
                mode: 'transaction',
                tx,
                query: ctx.query,
                job: job.name,
                tick,
                attempt,
                lateMs: this.lateMs(tick),
                catchUp: how === 'catch-up' || (state.kind === 'due' && state.catchUp),
                signal: this.runSignal(job, ctx.signal),
              });
            } catch (error) {
              // Lost connection or stop(): let the whole transaction roll back.
              if (ctx.signal.aborted || this.stopping.signal.aborted) throw error;
              await ctx.query(ROLLBACK_TO_SAVEPOINT).catch((rollback: unknown) => {
                // The handler ended the tick's transaction itself before it threw (its own
                // COMMIT or ROLLBACK): the savepoint went with it. The same misuse as below.
                if (['25P01', '3B001'].includes(sqlState(rollback) ?? ''))
                  throw taskEndedTransaction(`job "${job.name}"`);
                throw rollback;
              });
              await ctx.query(RECORD_SETTINGS);
              const record = this.failure(job, attempt, describeError(error));
              await this.ledger.finish(ctx.query, job, tick, null, record);
              return { kind: 'failed' as const, attempt, error, record, catchUp };
            }
            try {
              await ctx.query(RELEASE_SAVEPOINT);
            } catch (error) {
              // A statement of the handler failed and the handler caught the error and returned:
              // the savepoint's release fails (25P02, or the driver repeats the handler's own
              // error). Its work cannot commit; recording SUCCEEDED would be untrue and letting the
              // claim roll back would leave the tick to catch-up. It is a failed attempt.
              // Or the handler ended the tick's transaction itself (its own COMMIT or ROLLBACK):
              // the savepoint went with it (no transaction: 25P01; a new one it began: 3B001).
              // Not a rollback: what it wrote before may be committed, the claim with it. Asked
              // first: the server's answer says so even when stop() has aborted the run's signal
              // meanwhile (a deploy's SIGTERM after the handler's COMMIT), and rethrowing the raw
              // error then left the committed claim RUNNING with no runner.
              if (['25P01', '3B001'].includes(sqlState(error) ?? ''))
                throw taskEndedTransaction(`job "${job.name}"`);
              if (ctx.signal.aborted || isConnectionLoss(error)) throw error;
              const rolledBack = new CommitRolledBackError(
                `job "${job.name}": a statement of the handler failed inside the tick's transaction and the handler returned normally; none of its work can commit, so the attempt is recorded FAILED.`,
                { cause: error },
              );
              // A driver that keeps the failure for the whole transaction (drizzle on postgres.js)
              // refuses even the rollback to the savepoint: then nothing commits, the tick keeps
              // no row, and the error says why.
              await ctx.query(ROLLBACK_TO_SAVEPOINT).catch(() => {
                throw rolledBack;
              });
              await ctx.query(RECORD_SETTINGS);
              const record = this.failure(job, attempt, describeError(rolledBack));
              await this.ledger.finish(ctx.query, job, tick, null, record);
              return { kind: 'failed' as const, attempt, error: rolledBack, record, catchUp };
            }
            await ctx.query(RECORD_SETTINGS);
            await this.ledger.finish(ctx.query, job, tick, null, { kind: 'succeeded' });
            return { kind: 'ran' as const, attempt, catchUp };
          },
          {
            wait: true,
            timeoutMs: job.settings.claimTimeoutMs,
            signal: this.stopping.signal,
            // The wait is bounded by claimTimeoutMs alone: no statement_timeout (the client's
            // default included) may turn an overlap into an error. The handler gets its own.
            statementTimeoutMs: 0,
          },
        );
        await this.repairSelfCommitted(job, selfCommitted);
        if (!r.executed) return NOTHING;
        outcome = r.result;
        this.reportMissed(job, missed);
      } catch (error) {
        if (error instanceof LockTimeoutError && !this.stopping.signal.aborted) {
          const decision = await this.whenHeld(job, tick);
          if (decision === 'again') continue;
          this.reportHeld(job, tick, decision);
          if (decision === 'queued')
            return { catchUp: [], drain: await this.jobFreeAfterQueuing(job) };
          return NOTHING;
        }
        if (claimed && error instanceof LockNotHeldError) {
          // The handler ended the tick's transaction itself: its COMMIT committed its work so far
          // and the claim (a RUNNING row no runner would ever finish), or its ROLLBACK took both.
          // Recorded FAILED with the error, never retried (its work may be committed); no row
          // (rolled back) stays none, for catch-up — unless stop() ended the run meanwhile: then
          // the tick is given back, as any run stop() ends. The error event says LOCK_NOT_HELD.
          const record: RunRecord = { kind: 'failed', error: describeError(error) };
          const now = new Date(this.now());
          await this.query(async (q) => {
            const recorded = await this.ledger.finish(q, job, tick, null, record);
            if (!recorded && this.stopping.signal.aborted)
              await this.ledger.giveBack(q, job, tick, null, now);
          }).catch(() => {
            // Not written (the database away for a moment): the row would say RUNNING with no
            // runner for good. Written again later; meanwhile any node deciding this tick finds
            // it so and records it (see recordSelfCommitted) — never runs it again.
            this.recordLater(job, tick, record, Math.max(job.settings.retryDelayMs, 100));
          });
          throw error;
        }
        if (claimed && this.stopping.signal.aborted) {
          // The run rolled back: give the tick back so that the next instance runs it. Unless
          // the handler committed the tick's transaction itself before it threw on the stop
          // signal: its claim is then committed RUNNING (the give-back's insert finds the row),
          // and is recorded FAILED in the same transaction, as above, never run again.
          const now = new Date(this.now());
          const selfCommitted = await this.query(async (q) => {
            await this.ledger.giveBack(q, job, tick, null, now);
            return this.recordSelfCommitted(q, job, tick);
          });
          if (selfCommitted) throw taskEndedTransaction(`job "${job.name}"`);
          return NOTHING;
        }
        throw error;
      }
      if (outcome.kind === 'done') {
        this.emit({ type: 'skipped-done', job: job.name, tick });
        // A node that queued a tick while this one held the job's lock found the job busy and left
        // the queue to this node (see jobFreeAfterQueuing): it must look once it lets go.
        return { catchUp: outcome.catchUp, drain: job.settings.overlap === 'queue' };
      }
      if (outcome.kind === 'behind') {
        this.reportHeld(job, tick, outcome.decision);
        return { catchUp: outcome.catchUp, drain: true };
      }
      if (outcome.kind === 'failed') {
        this.emit({
          type: 'failed',
          job: job.name,
          tick,
          attempt: outcome.attempt,
          error: outcome.error,
          willRetry: outcome.record.kind === 'retry',
        });
        this.retryLater(job, tick, outcome.record);
        return { catchUp: outcome.catchUp, drain: true };
      }
      this.emit({
        type: 'ran',
        job: job.name,
        tick,
        attempt: outcome.attempt,
        durationMs: performance.now() - started,
      });
      return { catchUp: outcome.catchUp, drain: true };
    }
  }

  private async runInLease(job: Job<Tx>, tick: Date, how: TickSource): Promise<TickOutcome> {
    const schema = this.schema;
    // Claims take the tick's lock as runs in transaction mode do, so that a node whose wait for
    // the job's lock timed out judges a claim the same way (see whenHeld).
    const tickLock = lockStatement(this.tickKey(job, tick), 'transaction', 'exclusive', true);
    const settings = leaseSettings(job.settings.lease);
    // A fresh tick that finds an earlier tick's run holding the job waits this long for it to
    // end (polling the lease), as transaction mode waits for the job's lock: a node whose clock
    // runs ahead fires the next tick before that run ends, and must not call it an overlap.
    // Real time, as the lock wait's: claimTimeoutMs bounds how long a node waits, not a schedule.
    const waitUntil = performance.now() + job.settings.claimTimeoutMs;
    let pauseMs: number = LEASE_POLL_MS[0];
    for (;;) {
      const missed: Date[] = [];
      const selfCommitted: Date[] = [];
      const started = performance.now();
      let claim: JobResult<LeaseClaim>;
      try {
        const timeline = await timelineSource(this.locks.executor);
        claim = await this.locks.withLock<LeaseClaim>(
          this.keyOf(job),
          async (_tx, ctx) => {
            await ctx.query(tickLock.text, tickLock.params);
            const now = new Date(this.now());
            const state = await this.tickState(ctx.query, job, tick, now);
            if (state.kind === 'self-committed') {
              await this.recordSelfCommitted(ctx.query, job, tick);
              return { kind: 'done' as const };
            }
            if (state.kind !== 'free' && state.kind !== 'due' && state.kind !== 'runner-gone')
              return { kind: 'done' as const };
            const judge = () =>
              state.kind === 'free' && how === 'timer'
                ? this.catchUp(job, tick, ctx.query, missed, selfCommitted)
                : [];
            const behind = await this.queueBehind(job, tick, how, state, ctx.query, now);
            if (behind !== undefined)
              return { kind: 'behind' as const, decision: behind, catchUp: await judge() };
            const lease = await claimLease(
              ctx.query,
              schema,
              this.lockNamespace,
              job.name,
              settings,
              timeline,
            );
            if ('holder' in lease) {
              // Another tick's run holds the job. A fresh tick waits for it up to claimTimeoutMs
              // (with overlap 'queue' it waits in the ledger instead, where catch-up sees it and
              // the queue keeps its order), then overlaps it; one already in the ledger (due, or
              // its runner gone) waits there for whoever runs next.
              // No holder: the lease is free, but its row was locked for a moment — a finish in
              // flight, or a fenced write whose backend is still exiting after its FATAL reached
              // the client (through PgBouncer it arrives first). Nobody is running the job, so
              // nobody would run a tick already in the ledger next: it waits for the row, as a
              // fresh tick waits for a busy job. (A fresh tick with overlap 'queue' is queued in
              // the ledger instead, as for a busy job: waiting out of sight, catch-up on another
              // node would record it MISSED and a later tick could run before it.)
              const rowLockedOnly = lease.holder === undefined;
              if (
                ((rowLockedOnly && state.kind !== 'free') ||
                  (state.kind === 'free' && job.settings.overlap === 'skip')) &&
                performance.now() < waitUntil
              )
                return { kind: 'busy' as const };
              const decision =
                state.kind === 'free' ? await this.overlapped(job, tick, ctx.query) : 'later';
              return { kind: 'held' as const, decision, catchUp: await judge() };
            }
            const catchUp = await judge();
            // Runs that never finished under their token died with their holder: given back.
            await this.ledger.giveBackAbandoned(ctx.query, job, lease.token, now);
            const attempt = await this.ledger.claim(ctx.query, job, tick, lease.token, now);
            if (attempt === undefined)
              throw new LockkitError('LEASE_LOST', 'tick claimed concurrently'); // cannot happen under the lock
            const heldForCatchUp = state.kind === 'due' && state.catchUp;
            return { kind: 'claimed' as const, lease, attempt, catchUp, heldForCatchUp };
          },
          {
            wait: true,
            timeoutMs: job.settings.claimTimeoutMs,
            signal: this.stopping.signal,
            statementTimeoutMs: 0,
          },
        );
      } catch (error) {
        if (error instanceof LockTimeoutError && !this.stopping.signal.aborted) {
          // Claims hold the job's lock only briefly, so a wait this long meets a stuck claim. It
          // is an overlap only when that claim is another tick's: a claim of this very tick that
          // is slow, or dies, must not leave it SKIPPED for nobody to run (issue 24).
          const decision = await this.whenHeld(job, tick);
          if (decision === 'again') continue;
          this.reportHeld(job, tick, decision);
          return NOTHING;
        }
        throw error;
      }
      await this.repairSelfCommitted(job, selfCommitted);
      if (!claim.executed) return NOTHING;
      this.reportMissed(job, missed);
      const c = claim.result;
      if (c.kind === 'done') {
        this.emit({ type: 'skipped-done', job: job.name, tick });
        return NOTHING;
      }
      if (c.kind === 'busy') {
        const waited = await pause(
          Math.min(pauseMs, Math.max(1, waitUntil - performance.now())),
          this.stopping.signal,
        );
        if (!waited) return NOTHING; // stop(): the tick is left to catch-up
        pauseMs = Math.min(pauseMs * 2, LEASE_POLL_MS[1]);
        continue;
      }
      if (c.kind === 'held' || c.kind === 'behind') {
        if (c.decision !== 'later') this.reportHeld(job, tick, c.decision);
        const drain =
          c.kind === 'behind' || (c.decision === 'queued' && (await this.jobFreeAfterQueuing(job)));
        return { catchUp: c.catchUp, drain };
      }
      const { lease, attempt } = c;
      let record = { kind: 'succeeded' } as RunRecord;
      let givenBack: 'stopped' | 'interrupted' | undefined;
      // The error of this run's last fenced write when the database went away under it (a
      // failover, a restart): a handler that then fails did not fail by its own fault. Recording
      // it FAILED would lose the tick; it is given back to run again, as transaction mode's
      // rollback leaves it to run again. (Its write may have committed with an unanswered COMMIT:
      // lease mode runs such a tick at least once, as for a holder that dies mid-run.)
      let interrupted: unknown;
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
              lateMs: this.lateMs(tick),
              catchUp: how === 'catch-up' || c.heldForCatchUp,
              signal: this.runSignal(job, context.signal),
            }),
          {
            signal: this.stopping.signal,
            // A handler still running a whole ttlMs after its timeoutMs ignored its signal: let
            // the lease expire, so that the job is not held on every node for as long as this
            // process lives (fenced writes of the hung handler are refused from then on).
            ...(job.settings.timeoutMs !== undefined && {
              letGoAfterMs: job.settings.timeoutMs + settings.ttlMs,
            }),
            fenced: async (fencedTask) => {
              try {
                const result = await this.fenced(lease.token, job.name, fencedTask);
                interrupted = undefined;
                return result;
              } catch (error) {
                // Only lockkit's own word that the database went away: fencedWrite types a lost
                // connection or COMMIT answer, and passes the task's own errors unchanged — an
                // ENOENT or a connection of the task's own is the job failing, however it looks.
                interrupted =
                  isLockkitError(error) &&
                  (error.code === 'CONNECTION_LOST' || error.code === 'COMMIT_OUTCOME_UNKNOWN')
                    ? error
                    : undefined;
                throw error;
              }
            },
            alsoRecord: (result) => {
              // An interrupted run is given back with its attempt counted, at most
              // INTERRUPTED_GIVE_BACKS times beyond the job's attempts: a tick whose every run
              // loses its connection ends FAILED, not run forever.
              const giveBackInterrupted =
                interrupted !== undefined &&
                attempt < job.settings.maxAttempts + INTERRUPTED_GIVE_BACKS;
              if (result.failed && (this.stopping.signal.aborted || giveBackInterrupted)) {
                givenBack = this.stopping.signal.aborted ? 'stopped' : 'interrupted';
                return [
                  this.ledger.giveBackStatement(
                    job,
                    tick,
                    lease.token,
                    new Date(this.now()),
                    givenBack,
                  ),
                ];
              }
              record = result.failed ? this.failure(job, attempt, result.error) : record;
              return [this.ledger.finishStatement(job, tick, lease.token, record)];
            },
          },
        );
      } catch (error) {
        if (error instanceof LeaseLostError) {
          this.emit({ type: 'lease-lost', job: job.name, tick, error });
          return { catchUp: c.catchUp, drain: true };
        }
        if (givenBack === 'stopped') return NOTHING;
        if (givenBack === 'interrupted') {
          // Not the job failing: an error event, and the tick runs again once it is due (any
          // node's drain finds it PENDING; this node tries again after retryDelayMs).
          this.emit({ type: 'error', job: job.name, tick, error: interrupted });
          this.retryLater(job, tick, {
            kind: 'retry',
            error: describeError(error),
            retryAt: new Date(this.now() + job.settings.retryDelayMs),
          });
          return { catchUp: c.catchUp, drain: false };
        }
        if (record.kind === 'succeeded') throw error; // not the handler's failure
        this.emit({
          type: 'failed',
          job: job.name,
          tick,
          attempt,
          error,
          willRetry: record.kind === 'retry',
        });
        this.retryLater(job, tick, record);
        return { catchUp: c.catchUp, drain: true };
      }
      this.emit({
        type: 'ran',
        job: job.name,
        tick,
        attempt,
        durationMs: performance.now() - started,
      });
      return { catchUp: c.catchUp, drain: true };
    }
  }

  /**
   * A lease-mode run's fenced write: core's one fenced write (the fence, the task, the COMMIT's
   * truth told typed: CONNECTION_LOST before it, COMMIT_OUTCOME_UNKNOWN at it) under the job's lease.
   */
  private fenced<T>(
    token: bigint,
    job: string,
    task: (tx: Tx, query: QueryFn) => Promise<T> | T,
  ): Promise<T> {
    return fencedWrite(
      this.locks.executor,
      this.schema,
      { namespace: this.lockNamespace, jobKey: job, token },
      task,
    );
  }

  /**
   * Deletes each job's settled ledger rows older than `retentionMs` — never those a decision may
   * still read (see {@link lookBackMs}), never the job's latest row, and never a row after its
   * oldest PENDING or RUNNING one (catch-up takes a tick between its oldest recent row and now
   * with no row for a hole). One pass at a time: a pass that outlasts the interval is not joined
   * by another.
   */
  private async prune(): Promise<void> {
    if (this.pruning) return;
    this.pruning = true;
    try {
      for (let row = 0; row < this.names.size && !this.stopping.signal.aborted; row++) {
        const job = this.jobAt(row);
        const keepMs = this.prunedBeforeMs(job) as number;
        await this.query((q) => this.ledger.prune(q, job, keepMs)).catch(() => {});
      }
    } finally {
      this.pruning = false;
    }
  }

  /** What the ledger says about `tick` of `job`, a row this node's pruning may delete read as such. */
  private tickState(query: QueryFn, job: Job<Tx>, tick: Date, now: Date): Promise<TickState> {
    return this.ledger.state(query, job, tick, now, this.prunedBeforeMs(job));
  }

  /**
   * How old (ms, by the tick) a row of `job` this node's pruning may delete: `retentionMs`, and
   * never less than {@link lookBackMs}; null when this node prunes nothing (`retentionMs` 0). A
   * decision takes a tick older than that with no row for pruned (see Ledger.state): nodes that
   * share jobs should share `retentionMs`, as they share the settings of the look-back.
   */
  private prunedBeforeMs(job: Job<Tx>): number | null {
    return this.retentionMs > 0 ? Math.max(this.retentionMs, this.lookBackMs(job)) : null;
  }

  /**
   * How far back a decision about `job` may still read the ledger for a tick, at most: a node
   * whose clock is late by up to the grace may fire a tick up to `jitterMs` late and wait up to
   * `claimTimeoutMs` for the job before it looks; a successor in owned distribution holds the
   * ticks it owes from up to {@link MAX_OWED_MS} (and the grace) back. A tick's row younger than
   * this is what tells them it ran: deleting it would run the tick again.
   */
  private lookBackMs(job: Job<Tx>): number {
    const { jitterMs, claimTimeoutMs } = job.settings;
    return 2 * this.graceMs + jitterMs + claimTimeoutMs + MAX_OWED_MS + MIN_PRUNE_INTERVAL_MS;
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
