/**
 * Leases with fencing tokens, for jobs too long to hold a transaction open.
 *
 * The advisory lock is held only for the short transaction that claims the lease row (status
 * IN_PROGRESS, an expiry from the database clock, a fencing token bumped on every claim). The task
 * then runs outside any transaction while a heartbeat renews the expiry under its token. A holder
 * that stops renewing — killed, paused, cut off — loses the lease at expiry and the next claimer
 * takes it with a higher token; whatever the stale holder tries to record afterwards is refused.
 *
 * Three promises, and what keeps each (the SQL's side is in `sql/leases.ts`):
 * - Never two holders at once. Expiry is the database clock at the moment of each write; the
 *   holder counts its own deadline from when it *sent* its last successful claim or renewal, minus
 *   the safety margin, so it gives up before the database lets anyone else in; a claim answered
 *   so late that its first renewal could not come back in time is given back instead of started.
 * - A claim never waits on another holder: it takes no row lock unless the lease is free or
 *   expired, and skips a row someone holds a lock on.
 * - A live holder is never starved: nothing a rival does, and none of the holder's own fenced
 *   writes, holds up its renewals.
 *
 * @packageDocumentation
 */

import { randomUUID } from 'node:crypto';
import { hostname } from 'node:os';
import { setTimeout as sleep } from 'node:timers/promises';
import { MAX_TIMER_MS } from './clock.js';
import {
  askCommitStatus,
  checkCommittable,
  commitFailed,
  commitOutcomeUnknown,
} from './commit-truth.js';
import { isConnectionLoss, isLostOrOutcomeUnknown } from './connection-loss.js';
import { ConnectionLostError, isLockkitError, LeaseLostError, LockkitError } from './errors.js';
import type { LockkitEvent } from './events.js';
import type { LockExecutor, QueryFn, Row, TransactionContext } from './executor.js';
import { isStorableText, leaseKey } from './job-name.js';
import type { LockKey } from './keys.js';
import { fromPostgresError } from './postgres-errors.js';
import {
  claimStatement,
  fenceStatement,
  finishStatement,
  readLeaseStatement,
  renewStatement,
  type TimelineSource,
  TOKEN_SEQUENCE_BITS,
  TOKEN_TIMELINE_BITS,
} from './sql/leases.js';
import type { Statement } from './sql/locks.js';
import { timelineSource } from './wal-timeline.js';

/**
 * What a fencing token is made of; see {@link tokenParts}. Tokens compare as whole numbers —
 * generation first, then timeline, then sequence — and these parts only explain one.
 */
export interface FencingTokenParts {
  /**
   * Raised each time a claim found the previous token issued on a higher timeline than the
   * server's: the tables were restored or upgraded onto a new cluster (pg_upgrade starts it at
   * timeline 1). 0 until then.
   */
  readonly generation: number;
  /**
   * The WAL timeline of the primary that issued the token: 1 on a server never failed over, one
   * more after each promotion. 0 for tokens issued before tokens carried timelines.
   */
  readonly timeline: number;
  /** The claims counted on that timeline before this one (0 for the first). */
  readonly sequence: number;
}

const SEQUENCE_MASK = (1n << BigInt(TOKEN_SEQUENCE_BITS)) - 1n;
const TIMELINE_MASK = (1n << BigInt(TOKEN_TIMELINE_BITS)) - 1n;

/**
 * Takes a fencing token apart. A token is one positive int8: every claim's token is greater than
 * every earlier claim's, also across a failover to a standby that had not received the newest
 * claims — the promoted server is on a higher timeline, and a token's timeline sits above its
 * count of claims. So a holder's token is never issued again to anyone, and compares as a plain
 * integer; use the parts only to read what happened (a failover shows as a new timeline).
 *
 * @example
 * ```ts
 * tokenParts(lease.token); // { generation: 0, timeline: 2, sequence: 0 }: the first claim after a failover
 * ```
 */
export function tokenParts(token: bigint): FencingTokenParts {
  if (typeof token !== 'bigint' || token < 0n || token >= 1n << 63n) {
    throw new LockkitError('OPTION_INVALID', 'A fencing token is a non-negative int8 bigint.');
  }
  return {
    generation: Number(token >> BigInt(TOKEN_SEQUENCE_BITS + TOKEN_TIMELINE_BITS)),
    timeline: Number((token >> BigInt(TOKEN_SEQUENCE_BITS)) & TIMELINE_MASK),
    sequence: Number(token & SEQUENCE_MASK),
  };
}

/** How to hold a lease. */
export interface LeaseOptions {
  /** How long a claim or renewal keeps the lease, in ms (database clock). Default 30,000. */
  readonly ttlMs?: number;
  /**
   * How often the heartbeat renews, in ms: from 1 to half of `ttlMs − safetyMarginMs`, so that a
   * renewal has as long to come back as was waited to send it (a claim is held to the same
   * bound). Default a third of `ttlMs`, or half of `ttlMs − safetyMarginMs` when that is less.
   */
  readonly renewEveryMs?: number;
  /**
   * How long before the expiry, on this process's monotonic clock, the holder gives up if no
   * renewal has succeeded — so that it stops before anyone else can claim. From 0 to
   * `ttlMs − 2`. Default a fifth of `ttlMs` (at most 5 s).
   */
  readonly safetyMarginMs?: number;
  /**
   * Who holds the lease, stored in the row: 1 to 200 characters, without NUL (U+0000) or a lone
   * UTF-16 surrogate. Default `host:pid:random`.
   */
  readonly owner?: string;
  /**
   * Cancels the run. Already aborted: the call rejects with a {@link LockkitError} code
   * `ABORTED` before any SQL. Aborted while the task runs: the task's signal fires, and the run
   * is recorded FAILED even if the task then returns normally (the call then rejects with code
   * `ABORTED`) — a task stopped part-way often just returns (`if (signal.aborted) break`), and
   * recording that as COMPLETED would hide the unfinished part from whoever retries.
   */
  readonly signal?: AbortSignal;
  /**
   * `false` turns the heartbeat off: the lease then simply expires after `ttlMs`. For jobs known
   * to finish well within the TTL, and for tests that simulate a stalled holder. Default `true`.
   */
  readonly heartbeat?: boolean;
}

/** A lease being held, as the task sees it. */
export interface LeaseContext<Tx> {
  readonly namespace: string;
  readonly jobKey: string;
  /**
   * The fencing token: strictly greater than every earlier holder's, and never issued twice, even
   * across a failover that lost the newest claims (see {@link tokenParts}). Compare it as a
   * whole; do not assume consecutive holders' tokens differ by one.
   */
  readonly token: bigint;
  readonly owner: string;
  /** True when this claim took the lease over from a holder that had stopped renewing. */
  readonly tookOver: boolean;
  /** Aborted when the lease is lost (the reason is a {@link LeaseLostError}) or the caller aborts. */
  readonly signal: AbortSignal;
  /**
   * How long this holder may still act as the holder, in ms on this process's monotonic clock:
   * until its local deadline (when its last successful claim or renewal was sent, plus `ttlMs`,
   * minus `safetyMarginMs`). 0 once the lease is lost — including when the deadline has passed but
   * a blocked event loop has not yet run the timer that aborts `signal`: this reads the clock, and
   * aborts `signal` itself then. Check it before a step that must not run without the lease.
   */
  remainingMs(): number;
  /**
   * Runs `task` in a transaction that first checks this lease still holds under this token and
   * keeps any takeover from committing until the transaction ends: writes made through `tx` land
   * only while this token holds the lease. Throws {@link LeaseLostError} instead when it does not.
   * It does not hold up the heartbeat, but it does hold off a takeover even past the expiry: keep
   * fenced transactions short.
   */
  fenced<T>(task: (tx: Tx, query: QueryFn) => Promise<T> | T): Promise<T>;
}

/** A lease task. */
export type LeaseTask<Tx, T> = (lease: LeaseContext<Tx>) => Promise<T> | T;

/**
 * Who holds a lease when a claim did not get it, as the database had it committed when the claimer
 * looked (read without locking). `expiresAt` can be past: an expired holder whose fenced write is
 * still open keeps takeovers off until it ends.
 */
export interface LeaseHolder {
  readonly owner: string | null;
  readonly token: bigint;
  readonly expiresAt: Date;
}

/**
 * The outcome of {@link LeaseOperations.runWithLease}. `holder` is `undefined` only when no holder
 * was committed when the claimer looked: a rival's first claim was still in flight, or the last
 * holder had finished and a rival was just claiming.
 */
export type LeaseResult<T> =
  | { readonly executed: false; readonly holder: LeaseHolder | undefined }
  | { readonly executed: true; readonly result: T; readonly token: bigint };

/** Identifies a lease and the token a write must be fenced with. */
export interface LeaseRef {
  readonly namespace: string;
  readonly jobKey: string;
  readonly token: bigint;
}

/** The lease operations of a lock client. */
export interface LeaseOperations<Tx> {
  /**
   * Runs `task` on exactly one of the callers racing for `(namespace, jobKey)`, holding a lease
   * instead of a transaction: safe for jobs of minutes or hours. Needs the tables (`migrate()`).
   *
   * Exactly one caller claims; the others get `{ executed: false, holder }` at once, without
   * waiting on the holder or on each other. The winner's task runs outside any transaction with a
   * fencing token and a signal that fires if the lease is lost. It never starts on a lease it
   * cannot keep: a claim answered more than half of `ttlMs − safetyMarginMs` after it was sent (a
   * slow link, a stalled process) is given back and the call rejects with {@link LeaseLostError}. On return the run is recorded COMPLETED (or FAILED with the task's
   * error) under the token; a holder that lost its lease gets {@link LeaseLostError} instead, its
   * record refused. A dead holder's lease is taken over by the next claimer after it expires: no
   * sweeper needed. Renewals need a pooled connection of their own while the task holds one.
   *
   * @example
   * ```ts
   * await locks.migrate();
   * const r = await locks.runWithLease('reports', 'nightly', async (lease) => {
   *   for (const chunk of chunks) {
   *     lease.signal.throwIfAborted();
   *     await lease.fenced((tx) => writeChunk(tx, chunk)); // refused if the lease was lost
   *   }
   * }, { ttlMs: 60_000 });
   * ```
   */
  runWithLease<T>(
    namespace: string,
    jobKey: string,
    task: LeaseTask<Tx, T>,
    options?: LeaseOptions,
  ): Promise<LeaseResult<T>>;

  /**
   * Runs `task` in a transaction that first verifies `lease.token` still holds the lease; see
   * {@link LeaseContext.fenced}. For writes made outside the task's own context.
   */
  withFencedWrite<T>(lease: LeaseRef, task: (tx: Tx, query: QueryFn) => Promise<T> | T): Promise<T>;
}

/** Validated lease settings. @internal */
export interface LeaseSettings {
  readonly ttlMs: number;
  readonly renewEveryMs: number;
  readonly safetyMarginMs: number;
  readonly owner: string;
  readonly heartbeat: boolean;
}

function integerOption(value: unknown, name: string, min: number, max: number): number {
  if (typeof value !== 'number' || !Number.isInteger(value) || value < min || value > max) {
    throw new LockkitError(
      'OPTION_INVALID',
      `${name} must be an integer from ${min} to ${max}, got ${String(value)}.`,
    );
  }
  return value;
}

/** Validates lease options. @internal */
export function leaseSettings(options: LeaseOptions): LeaseSettings {
  if (typeof options !== 'object' || options === null || Array.isArray(options)) {
    throw new LockkitError(
      'OPTION_INVALID',
      `The lease options must be an object, got ${Array.isArray(options) ? 'an array' : String(options)}.`,
    );
  }
  const ttlMs = integerOption(options.ttlMs ?? 30_000, 'ttlMs', 50, 2_147_483_647);
  // At least 2 ms left between a send and the local deadline, for renewEveryMs of 1 ms (below).
  const safetyMarginMs = integerOption(
    options.safetyMarginMs ?? Math.min(Math.floor(ttlMs / 5), 5000),
    'safetyMarginMs',
    0,
    ttlMs - 2,
  );
  // A renewal is a round trip: one sent as late as the local deadline cannot be answered before
  // it, and the lease is lost every time. Held to the claim's own bound (a claim answered more
  // than half of ttlMs − safetyMarginMs after it was sent is given back): a renewal sent at most
  // half the window after the last successful send has as long again to come back.
  const window = ttlMs - safetyMarginMs;
  const renewEveryMs = integerOption(
    options.renewEveryMs ?? Math.min(Math.floor(ttlMs / 3), Math.floor(window / 2)),
    'renewEveryMs',
    1,
    2_147_483_647,
  );
  if (renewEveryMs * 2 > window) {
    throw new LockkitError(
      'OPTION_INVALID',
      `renewEveryMs ${renewEveryMs} is more than half of ttlMs − safetyMarginMs (ttlMs ${ttlMs} − safetyMarginMs ${safetyMarginMs} = ${window} ms): a renewal sent that late could not be answered before the holder's deadline. Use at most ${Math.floor(window / 2)}.`,
    );
  }
  const owner = options.owner ?? `${hostname()}:${process.pid}:${randomUUID().slice(0, 8)}`;
  if (
    typeof owner !== 'string' ||
    owner.length === 0 ||
    owner.length > 200 ||
    !isStorableText(owner)
  ) {
    throw new LockkitError(
      'OPTION_INVALID',
      'owner must be a string of 1 to 200 characters, without NUL (U+0000) or a lone UTF-16 surrogate (PostgreSQL text cannot store it as given).',
    );
  }
  if (options.heartbeat !== undefined && typeof options.heartbeat !== 'boolean') {
    throw new LockkitError('OPTION_INVALID', 'heartbeat must be a boolean.');
  }
  if (options.signal !== undefined && !(options.signal instanceof AbortSignal)) {
    throw new LockkitError('OPTION_INVALID', 'signal must be an AbortSignal.');
  }
  return { ttlMs, renewEveryMs, safetyMarginMs, owner, heartbeat: options.heartbeat ?? true };
}

/**
 * How long a claim's statements may run on the server before Postgres cancels them. A claim never
 * waits on a row by construction; this is the backstop should anything still make it wait (an
 * operator's `LOCK TABLE` or `ALTER TABLE` on the leases table, a future change): the call then
 * rejects with a `STATEMENT_TIMEOUT` error instead of hanging. Server time only, so a slow network
 * does not trip it.
 */
function claimStatementTimeoutMs(s: LeaseSettings): number {
  return Math.min(5000, Math.max(1000, s.ttlMs - s.safetyMarginMs));
}

const describeError = (error: unknown): string =>
  error instanceof Error ? `${error.name}: ${error.message}` : String(error);

/**
 * Keeps one lease alive: sends a renewal `renewEveryMs` after the previous one was sent (or as
 * soon as it is answered, when it took longer), and keeps the local deadline — when the last
 * successful claim or renewal was sent, plus `ttlMs`, minus `safetyMarginMs`, on the monotonic
 * clock. The database's expiry is at least `ttlMs` after that send, so a holder that stops at its
 * deadline stops at least the margin before anyone else can claim. When a lost lease is noticed
 * is the holder's business (`lose`); this only reports why. @internal
 */
export class Heartbeat {
  private deadline: number;
  private renewTimer: NodeJS.Timeout | undefined;
  private deadlineTimer: NodeJS.Timeout | undefined;
  private stopped = false;
  /** The renewal in flight, if any, and when it was sent. */
  private beating: Promise<void> | undefined;
  private inFlightSince: number | undefined;
  /** When the next renewal was due, and the most any of this lease's timers ran late. */
  private dueAt = 0;
  private lateMs = 0;

  constructor(
    private readonly renew: () => Promise<boolean>,
    private readonly s: LeaseSettings,
    private readonly lose: (reason: string) => void,
    claimSentAt: number,
  ) {
    this.deadline = claimSentAt + s.ttlMs - s.safetyMarginMs;
    this.armDeadline();
    if (s.heartbeat) this.schedule(claimSentAt + s.renewEveryMs);
  }

  /** Milliseconds to the local deadline (≤ 0 once it has passed). */
  remaining(): number {
    return this.deadline - performance.now();
  }

  /** Why the deadline passed, for the {@link LeaseLostError}: a slow database or a blocked process. */
  deadlineReason(): string {
    const now = performance.now();
    const late = Math.max(this.lateMs, now - this.deadline);
    const window = this.s.ttlMs - this.s.safetyMarginMs;
    let why: string;
    if (!this.s.heartbeat) why = 'the heartbeat is off';
    else if (this.inFlightSince !== undefined && now - this.inFlightSince < window)
      why = `a renewal sent ${Math.round(now - this.inFlightSince)} ms earlier was still unanswered (the database or the network is slow)`;
    else why = 'no renewal was answered';
    const blocked =
      late >= 20
        ? `; this process's event loop was blocked: a timer ran ${Math.round(late)} ms late`
        : '';
    return `no renewal succeeded within ttlMs − safetyMarginMs (${window} ms) of the last one sent: ${why}${blocked}`;
  }

  private armDeadline(): void {
    clearTimeout(this.deadlineTimer);
    const due = this.deadline;
    this.deadlineTimer = setTimeout(
      () => {
        this.lateMs = Math.max(this.lateMs, performance.now() - due);
        this.lose(this.deadlineReason());
      },
      Math.max(0, due - performance.now()),
    );
    this.deadlineTimer.unref();
  }

  private schedule(at: number): void {
    // Never due in the past (a claim answered late makes the first renewal due at once): lateness
    // is measured from here, and must mean the event loop, not a slow claim.
    this.dueAt = Math.max(at, performance.now());
    this.renewTimer = setTimeout(
      () => {
        this.beating = this.beat();
      },
      Math.max(0, at - performance.now()),
    );
    this.renewTimer.unref();
  }

  private async beat(): Promise<void> {
    if (this.stopped) return;
    const sentAt = performance.now();
    this.lateMs = Math.max(this.lateMs, sentAt - this.dueAt);
    this.inFlightSince = sentAt;
    let renewed: boolean | undefined;
    try {
      renewed = await this.renew();
    } catch {
      // A failed renewal is retried on the next beat; the deadline decides when it is too late.
    }
    this.inFlightSince = undefined;
    if (this.stopped) return;
    if (renewed === false) {
      this.lose('a renewal found the lease expired or held under another token');
      return;
    }
    if (renewed === true) {
      // Counted from the send: the database's new expiry is at least ttlMs after it. A renewal
      // answered after the deadline passed (unnoticed, in a busy loop) still counts: it found
      // this token holding the lease, so nobody else held it meanwhile.
      this.deadline = Math.max(this.deadline, sentAt + this.s.ttlMs - this.s.safetyMarginMs);
      this.lateMs = 0;
      this.armDeadline();
    }
    this.schedule(Math.max(performance.now(), sentAt + this.s.renewEveryMs));
  }

  /**
   * Stops renewing; resolves once a renewal in flight has been answered, or at the local deadline
   * if it has not been by then. A renewal whose answer never comes — a driver that lost the
   * request with its broken connection (postgres.js drops a `reserve()` queued on a pool of one
   * when the connection under it is cut) — must not hold the run's end forever: past the
   * deadline the lease counts as lost whatever that renewal would have said.
   */
  stop(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.renewTimer);
    clearTimeout(this.deadlineTimer);
    const beating = this.beating;
    if (beating === undefined) return Promise.resolve();
    return new Promise<void>((resolve) => {
      const timer = setTimeout(resolve, Math.max(0, this.remaining()));
      void beating.then(() => {
        clearTimeout(timer);
        resolve();
      });
    });
  }
}

/** A lease this process has just claimed. @internal */
export interface ClaimedLease extends LeaseRef {
  readonly tookOver: boolean;
  /** When the claim was sent, on the monotonic clock: the local deadline counts from here. */
  readonly claimSentAt: number;
}

/** Pauses between a lease's record attempts after a lost connection: from, doubling up to. */
const RECORD_RETRY_MS = [25, 400] as const;

/** The holder described by a lease row, when the row has one (an IN_PROGRESS lease). */
function holderOf(row: Row | undefined): LeaseHolder | undefined {
  if (row?.status !== 'IN_PROGRESS') return undefined;
  return {
    owner: (row.owner as string | null) ?? null,
    token: BigInt(row.token as string),
    expiresAt: new Date(row.expires_at as string),
  };
}

/**
 * Claims the lease row inside a transaction that holds the job's advisory lock: the claimed
 * lease, or who holds it. One statement; it never waits on a row. @internal
 */
export async function claimLease(
  query: QueryFn,
  schema: string,
  namespace: string,
  jobKey: string,
  s: LeaseSettings,
  timeline: TimelineSource,
): Promise<ClaimedLease | { holder: LeaseHolder | undefined }> {
  const claimSentAt = performance.now();
  const claim = claimStatement(schema, namespace, jobKey, s.owner, s.ttlMs, timeline);
  const [row] = await query(claim.text, claim.params);
  if (row?.claimed === true) {
    return {
      namespace,
      jobKey,
      token: BigInt(row.token as string),
      tookOver: row.took_over === true,
      claimSentAt,
    };
  }
  return { holder: holderOf(row) };
}

/**
 * Runs a fenced write: `task` in a transaction that first checks `lease.token` still holds a valid
 * lease, and throws {@link LeaseLostError} instead when it does not. While the transaction is open
 * no claim can take the lease over, yet the holder's renewals go on (see `fenceStatement`). The
 * reference is trusted: entry points validate it first. @internal
 */
export async function fencedWrite<Tx, T>(
  executor: LockExecutor<Tx, unknown>,
  schema: string,
  lease: LeaseRef,
  task: (tx: Tx, query: QueryFn) => Promise<T> | T,
): Promise<T> {
  const fence = fenceStatement(schema, lease.namespace, lease.jobKey, lease.token);
  const what = `fenced write of ${lease.namespace}/${lease.jobKey}`;
  // Set once the task has succeeded on a live connection: what fails after it is the COMMIT.
  let committing = false;
  // The transaction's id and the task's result: a COMMIT whose answer was lost is asked about.
  let xid: string | undefined;
  let done: { readonly result: T } | undefined;
  // The transaction's context, and the task's own error, for telling a lost connection below.
  let context: TransactionContext<Tx> | undefined;
  let taskError: { readonly error: unknown } | undefined;
  const statementErrors = new WeakSet<object>();
  try {
    return await executor.transaction(async (ctx) => {
      context = ctx;
      const { query, tx } = ctx;
      // The fence's own failure is lockkit's to name (a standby refuses it with 25006); the
      // task's errors stay the task's.
      const fenced = await query(fence.text, fence.params).catch((error: unknown) => {
        throw fromPostgresError(error, what);
      });
      if (fenced.length === 0) {
        throw new LeaseLostError(
          `fenced write refused: ${lease.namespace}/${lease.jobKey} is no longer held under token ${lease.token}.`,
          lease.token,
        );
      }
      let result: T;
      // What the transaction's own connection answered with: a statement of the task's that the
      // server refused on lockkit's connection (the FATAL of a terminated backend can reach it
      // before the driver reports the socket closed) speaks for that connection, not the task.
      const onConnection = (text: string, params?: readonly unknown[]) =>
        query(text, params).catch((error: unknown) => {
          if (typeof error === 'object' && error !== null) statementErrors.add(error);
          throw error;
        });
      try {
        result = await task(tx, onConnection);
      } catch (error) {
        taskError = { error };
        throw error;
      }
      // A write the task's caught error rolled back must not be reported as written.
      await checkCommittable(executor, ctx, what, fenced[0]?.began);
      committing = !(ctx.lost ?? ctx.signal.aborted);
      xid = typeof fenced[0]?.xid === 'string' ? fenced[0].xid : undefined;
      done = { result };
      return result;
    });
  } catch (error) {
    if (!committing) {
      const onLockkitConnection =
        typeof error === 'object' && error !== null && statementErrors.has(error);
      throw (
        connectionLostBeforeCommit(error, context, taskError, what, onLockkitConnection) ?? error
      );
    }
    const failed = commitOutcomeUnknown(error, false, what) ?? commitFailed(error, what) ?? error;
    if (!isLockkitError(failed) || failed.code !== 'COMMIT_OUTCOME_UNKNOWN' || xid === undefined)
      throw failed;
    // The answer to COMMIT was lost: the server knows how the transaction ended. A holder that
    // went on to run the task again would write twice; one that gave up would lose the write.
    const status = await askCommitStatus(executor, xid, COMMIT_STATUS_WAIT_MS);
    if (status === 'committed' && done !== undefined) return done.result;
    if (status === 'aborted') {
      throw new ConnectionLostError(
        `${what}: the connection was lost at COMMIT and the server rolled the transaction back: nothing was written.`,
        { cause: error },
      );
    }
    throw failed;
  }
}

/** How long a fenced write whose COMMIT answer was lost waits for the server to know its end. */
const COMMIT_STATUS_WAIT_MS = 2000;

/**
 * A fenced write's failure before its COMMIT was sent, when it is the loss of the transaction's
 * connection: a {@link ConnectionLostError} (the transaction rolled back, nothing was written)
 * instead of the driver's raw error — lockkit's own statements (BEGIN, the fence) hit the dead
 * link, or the executor saw the connection go while the task ran, or a statement the task sent
 * through lockkit's `query` met it (`onLockkitConnection`). The task's own error on a live
 * connection passes unchanged (it may come from a connection of the task's own); undefined when
 * the failure is not a lost connection.
 */
function connectionLostBeforeCommit(
  error: unknown,
  context: Pick<TransactionContext<unknown>, 'signal' | 'lost'> | undefined,
  taskError: { readonly error: unknown } | undefined,
  what: string,
  onLockkitConnection: boolean,
): ConnectionLostError | undefined {
  if (error instanceof LockkitError) return undefined;
  const lost = context?.lost ?? context?.signal.aborted ?? false;
  const own = taskError?.error === error && !onLockkitConnection;
  if (!lost && (own || !isConnectionLoss(error))) return undefined;
  const mapped = fromPostgresError(error, what);
  if (mapped instanceof ConnectionLostError) return mapped;
  return new ConnectionLostError(
    `${what}: the connection was lost before COMMIT was sent; the transaction rolled back and nothing was written.`,
    { cause: error },
  );
}

/**
 * Calls `callback` once `ms` have passed on the monotonic clock, on a timer that never keeps the
 * process alive; the returned function cancels it. A wait longer than {@link MAX_TIMER_MS} —
 * which `setTimeout` would cut to 1 ms — is slept in steps of at most that, re-reading the clock
 * after each. `Infinity` never calls back; NaN and negative waits count as 0.
 */
function afterMonotonic(ms: number, callback: () => void): () => void {
  if (ms === Number.POSITIVE_INFINITY) return () => {};
  const wait = Math.max(0, ms || 0);
  const due = performance.now() + wait;
  const step = (): void => {
    const left = due - performance.now();
    if (left <= 0) {
      callback();
      return;
    }
    timer = setTimeout(step, Math.min(Math.ceil(left), MAX_TIMER_MS));
    timer.unref();
  };
  // The first step is a timer too, as the bare setTimeout was: never a call from the caller's stack.
  let timer = setTimeout(step, Math.min(wait, MAX_TIMER_MS));
  timer.unref();
  return () => clearTimeout(timer);
}

/** How a run's task ended. */
type Outcome<T> =
  | { readonly kind: 'returned'; readonly result: T }
  | { readonly kind: 'threw'; readonly error: unknown }
  | { readonly kind: 'aborted'; readonly reason: unknown };

/**
 * Runs `task` holding a claimed lease: heartbeat, signal on loss, then records the end under the
 * token, together with `alsoRecord`'s statements in the same transaction. Resolves with the
 * task's result; rejects with the task's error (recorded FAILED), {@link LeaseLostError}, or —
 * with `abortIsFailure` — a `LockkitError` code `ABORTED` for a run whose `signal` aborted before
 * its task settled (recorded FAILED, even if the task returned). @internal
 */
export async function holdLease<Tx, T>(
  executor: LockExecutor<Tx, unknown>,
  schema: string,
  lease: ClaimedLease,
  s: LeaseSettings,
  task: (context: LeaseContext<Tx>) => Promise<T> | T,
  options: {
    readonly signal?: AbortSignal;
    readonly fenced: LeaseContext<Tx>['fenced'];
    readonly alsoRecord?: (
      outcome: { failed: false } | { failed: true; error: string },
    ) => Statement[];
    readonly onLost?: (error: LeaseLostError) => void;
    readonly emit?: (event: LockkitEvent) => void;
    /** Record a run aborted through `signal` as FAILED and reject with `ABORTED` (runWithLease). */
    readonly abortIsFailure?: boolean;
    /**
     * Stop renewing once the task has run this long without settling (it ignored its signal):
     * the lease then expires and another worker may take over, instead of a hung task holding
     * the job on every node for as long as its process lives. Any number of ms from 0 up —
     * the scheduler passes `timeoutMs + ttlMs`, up to twice `MAX_TIMEOUT_MS` — waited in
     * full, however far past what one `setTimeout` can wait; `Infinity` never lets go.
     */
    readonly letGoAfterMs?: number;
  },
): Promise<T> {
  const { namespace, jobKey, token } = lease;
  const emit = options.emit;
  const heldSince = performance.now();
  emit?.({ type: 'lease-claimed', namespace, jobKey, token, tookOver: lease.tookOver });
  const lost = new AbortController();
  // Called only from timers, answers and later checks: never before `beats` exists.
  const lose = (reason: string) => {
    if (lost.signal.aborted) return;
    void beats.stop();
    emit?.({ type: 'lease-lost', namespace, jobKey, token, reason });
    const error = new LeaseLostError(
      `lease ${namespace}/${jobKey} (token ${token}) lost: ${reason}.`,
      token,
    );
    lost.abort(error);
    options.onLost?.(error);
  };
  const renew = renewStatement(schema, namespace, jobKey, token, s.ttlMs);
  const beats = new Heartbeat(
    async () => {
      const renewed =
        (await executor.transaction(({ query }) => query(renew.text, renew.params))).length > 0;
      if (renewed) emit?.({ type: 'lease-renewed', namespace, jobKey, token });
      return renewed;
    },
    s,
    lose,
    lease.claimSentAt,
  );
  const remainingMs = (): number => {
    if (lost.signal.aborted) return 0;
    const left = beats.remaining();
    if (left > 0) return left;
    lose(beats.deadlineReason());
    return 0;
  };
  const recordOnce = async (outcome: { failed: false } | { failed: true; error: string }) => {
    const finish = finishStatement(schema, namespace, jobKey, token, outcome);
    return executor.transaction(async ({ query }) => {
      // The lease's own record first: when it is refused, nothing else is written either.
      if ((await query(finish.text, finish.params)).length === 0) return false;
      for (const statement of options.alsoRecord?.(outcome) ?? []) {
        await query(statement.text, statement.params);
      }
      return true;
    });
  };
  // The record's connection can die under it — a failover, a pooler or server restart — before
  // or after its COMMIT reached the server. Giving up then would leave the run IN_PROGRESS until
  // the lease expires, and a finished run would be run again. So, while the lease still holds,
  // the holder asks again on a new connection: its token's row already finished means the record
  // committed (only this token's holder finishes it); still IN_PROGRESS under its token means it
  // did not, and it records again; another token means the lease was lost.
  const read = readLeaseStatement(schema, namespace, jobKey);
  const record = async (outcome: { failed: false } | { failed: true; error: string }) => {
    let lastLoss: unknown;
    let pauseMs: number = RECORD_RETRY_MS[0];
    for (;;) {
      try {
        if (lastLoss !== undefined) {
          const [row] = await executor.transaction(({ query }) => query(read.text, read.params));
          if (
            row?.token === undefined ||
            row.token === null ||
            BigInt(row.token as string) !== token
          )
            return false;
          if (row.status !== 'IN_PROGRESS')
            return row.status === (outcome.failed ? 'FAILED' : 'COMPLETED');
        }
        return await recordOnce(outcome);
      } catch (error) {
        // A lost connection, or a COMMIT whose answer never came: the record may be asked for again.
        if (!isLostOrOutcomeUnknown(error)) throw error;
        lastLoss = error;
      }
      if (remainingMs() <= 0) throw lastLoss;
      await sleep(pauseMs);
      pauseMs = Math.min(pauseMs * 2, RECORD_RETRY_MS[1]);
    }
  };

  // A claim answered late — a slow link, a stalled process — is given back rather than started
  // when less time is left before the local deadline than the claim itself took: the first
  // renewal, as slow a round trip, could not come back in time, and the task would start on a
  // lease it cannot keep. That is, answered more than half of ttlMs − safetyMarginMs after it was
  // sent (so always with more than the margin left in the database). Given back, the next claimer
  // need not wait for it to expire.
  const claimTookMs = performance.now() - lease.claimSentAt;
  if (claimTookMs > (s.ttlMs - s.safetyMarginMs) / 2) {
    lose(
      `the claim was answered ${Math.round(claimTookMs)} ms after it was sent, more than half of ttlMs − safetyMarginMs (${s.ttlMs - s.safetyMarginMs} ms): too little was left to renew in time, so it was given back without starting the task`,
    );
    await beats.stop();
    // Only the lease row: the caller's own records (alsoRecord) stay as for any lost lease.
    const giveBack = finishStatement(schema, namespace, jobKey, token, {
      failed: true,
      error: 'LeaseLostError: claimed too late: given back without starting the task',
    });
    await executor
      .transaction(({ query }) => query(giveBack.text, giveBack.params))
      .catch(() => undefined);
    throw lost.signal.reason as LeaseLostError;
  }

  const signal = options.signal ? AbortSignal.any([lost.signal, options.signal]) : lost.signal;
  const context: LeaseContext<Tx> = {
    namespace,
    jobKey,
    token,
    owner: s.owner,
    tookOver: lease.tookOver,
    signal,
    remainingMs,
    fenced: options.fenced,
  };
  const aborted = () => options.abortIsFailure === true && options.signal?.aborted === true;
  let outcome: Outcome<T>;
  const ms = options.letGoAfterMs;
  const cancelLetGo =
    ms === undefined
      ? undefined
      : afterMonotonic(ms, () =>
          lose(`the task ran ${ms} ms without settling, past its time limit: the lease is let go`),
        );
  try {
    if (aborted()) {
      outcome = { kind: 'aborted', reason: options.signal?.reason };
    } else {
      const result = await task(context);
      outcome = aborted()
        ? { kind: 'aborted', reason: options.signal?.reason }
        : { kind: 'returned', result };
    }
  } catch (error) {
    outcome = { kind: 'threw', error };
  } finally {
    cancelLetGo?.();
  }
  // The finish must not race this lease's own renewal in flight (it would queue behind its lock).
  await beats.stop();
  const outcomeRecord =
    outcome.kind === 'returned'
      ? { failed: false as const }
      : {
          failed: true as const,
          error:
            outcome.kind === 'threw'
              ? describeError(outcome.error)
              : `aborted by its signal before the task settled: ${describeError(outcome.reason)}`,
        };
  // The local deadline is part of the verdict: a lease this holder had to consider lost is not
  // recorded, even if the database would still take the record.
  const recorded = remainingMs() > 0 && (await record(outcomeRecord));
  if (!recorded) {
    const reason = lost.signal.reason instanceof LeaseLostError ? lost.signal.reason.message : '';
    const cause =
      outcome.kind === 'threw'
        ? { cause: outcome.error }
        : outcome.kind === 'aborted'
          ? { cause: outcome.reason }
          : {};
    const error = new LeaseLostError(
      `lease ${namespace}/${jobKey} (token ${token}) was lost before the run ended; its ${outcome.kind === 'returned' ? 'completion' : 'failure'} was not recorded. ${reason}`.trim(),
      token,
      cause,
    );
    if (!lost.signal.aborted) options.onLost?.(error);
    throw error;
  }
  emit?.({
    type: 'lease-finished',
    namespace,
    jobKey,
    token,
    failed: outcome.kind !== 'returned',
    heldMs: performance.now() - heldSince,
  });
  if (outcome.kind === 'threw') throw outcome.error;
  if (outcome.kind === 'aborted') {
    throw new LockkitError(
      'ABORTED',
      `The lease run ${namespace}/${jobKey} (token ${token}) was aborted by its signal before its task settled; it was recorded FAILED.`,
      { cause: outcome.reason },
    );
  }
  return outcome.result;
}

/**
 * The lease operations over an executor. `withTryLock` is the lock client's transaction-scoped
 * try-lock, which the claim runs under (with `statementTimeoutMs` set in that transaction);
 * `schema` is the quoted schema name.
 */
export function leaseOperations<Tx>(
  executor: LockExecutor<Tx, unknown>,
  withTryLock: <T>(
    key: LockKey,
    task: (query: QueryFn) => Promise<T>,
    options: { readonly statementTimeoutMs: number; readonly signal?: AbortSignal },
  ) => Promise<{ executed: false } | { executed: true; result: T }>,
  schema: string,
  emit?: (event: LockkitEvent) => void,
): LeaseOperations<Tx> {
  async function withFencedWrite<T>(
    lease: LeaseRef,
    task: (tx: Tx, query: QueryFn) => Promise<T> | T,
  ): Promise<T> {
    // Refuse a malformed reference before any SQL, like every other entry point.
    if (typeof lease !== 'object' || lease === null)
      throw new LockkitError('OPTION_INVALID', 'The lease must be { namespace, jobKey, token }.');
    leaseKey(lease.namespace, lease.jobKey);
    if (typeof lease.token !== 'bigint' || lease.token < 1n || lease.token >= 2n ** 63n)
      throw new LockkitError('OPTION_INVALID', 'The lease token must be a positive int8 bigint.');
    if (typeof task !== 'function')
      throw new LockkitError('OPTION_INVALID', 'The task must be a function.');
    return fencedWrite(executor, schema, lease, task);
  }

  /** Who holds the lease now, read without locking: for a claimer that lost the claim race. */
  async function readHolder(namespace: string, jobKey: string): Promise<LeaseHolder | undefined> {
    const read = readLeaseStatement(schema, namespace, jobKey);
    const [row] = await executor.transaction(({ query }) => query(read.text, read.params));
    return holderOf(row);
  }

  async function runWithLease<T>(
    namespace: string,
    jobKey: string,
    task: LeaseTask<Tx, T>,
    options: LeaseOptions = {},
  ): Promise<LeaseResult<T>> {
    const key = leaseKey(namespace, jobKey);
    if (typeof task !== 'function')
      throw new LockkitError('OPTION_INVALID', 'The task must be a function.');
    const s = leaseSettings(options);
    if (options.signal?.aborted) {
      throw new LockkitError(
        'ABORTED',
        `runWithLease ${namespace}/${jobKey}: the signal was aborted before the claim.`,
        { cause: options.signal.reason },
      );
    }
    const timeline = await timelineSource(
      executor,
      options.signal,
      (signal) =>
        new LockkitError(
          'ABORTED',
          `runWithLease ${namespace}/${jobKey}: the signal was aborted before the claim.`,
          { cause: signal.reason },
        ),
    );
    const claimed = await withTryLock(
      key,
      (query) => claimLease(query, schema, namespace, jobKey, s, timeline),
      // The signal bounds the claim's wait for a connection too.
      {
        statementTimeoutMs: claimStatementTimeoutMs(s),
        ...(options.signal !== undefined && { signal: options.signal }),
      },
    );
    // Another claimer held the job's lock for its own claim: tell who holds the lease now.
    if (!claimed.executed) return { executed: false, holder: await readHolder(namespace, jobKey) };
    if ('holder' in claimed.result) return { executed: false, holder: claimed.result.holder };
    const lease = claimed.result;
    const result = await holdLease(executor, schema, lease, s, task, {
      ...(options.signal !== undefined && { signal: options.signal }),
      ...(emit !== undefined && { emit }),
      fenced: (fencedTask) => withFencedWrite(lease, fencedTask),
      abortIsFailure: true,
    });
    return { executed: true, result, token: lease.token };
  }

  return { runWithLease, withFencedWrite };
}
