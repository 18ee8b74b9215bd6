/**
 * Leases with fencing tokens, for jobs too long to hold a transaction open.
 *
 * The advisory lock is held only for the short transaction that claims the lease row (status
 * IN_PROGRESS, an expiry from the database clock, a fencing token bumped on every claim). The task
 * then runs outside any transaction while a heartbeat renews the expiry under its token. A holder
 * that stops renewing — killed, paused, cut off — loses the lease at expiry and the next claimer
 * takes it with a higher token; whatever the stale holder tries to record afterwards is refused.
 *
 * @packageDocumentation
 */
import { randomUUID } from 'node:crypto';
import { hostname } from 'node:os';
import { LeaseLostError, LockkitError } from './errors.js';
import type { LockkitEvent } from './events.js';
import type { LockExecutor, QueryFn } from './executor.js';
import { LockKey } from './keys.js';
import {
  claimStatement,
  fenceStatement,
  finishStatement,
  readLeaseStatement,
  renewStatement,
} from './sql/leases.js';
import type { Statement } from './sql/locks.js';

/** How to hold a lease. */
export interface LeaseOptions {
  /** How long a claim or renewal keeps the lease, in ms (database clock). Default 30,000. */
  readonly ttlMs?: number;
  /** How often the heartbeat renews, in ms. Default a third of `ttlMs`. */
  readonly renewEveryMs?: number;
  /**
   * How long before the expiry, on this process's monotonic clock, the holder gives up if no
   * renewal has succeeded — so that it stops before anyone else can claim. Default a fifth of
   * `ttlMs` (at most 5 s).
   */
  readonly safetyMarginMs?: number;
  /** Who holds the lease, stored in the row. Default `host:pid:random`. */
  readonly owner?: string;
  /** Aborts the task (combined into its signal); the lease is then recorded as failed. */
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
  /** The fencing token: strictly greater than every earlier holder's. */
  readonly token: bigint;
  readonly owner: string;
  /** True when this claim took the lease over from a holder that had stopped renewing. */
  readonly tookOver: boolean;
  /** Aborted when the lease is lost (the reason is a {@link LeaseLostError}) or the caller aborts. */
  readonly signal: AbortSignal;
  /**
   * Runs `task` in a transaction that first checks this lease still holds under this token (and
   * keeps a new claim from committing until it ends): writes made through `tx` land only while the
   * lease is valid. Throws {@link LeaseLostError} instead when it is not.
   */
  fenced<T>(task: (tx: Tx, query: QueryFn) => Promise<T> | T): Promise<T>;
}

/** A lease task. */
export type LeaseTask<Tx, T> = (lease: LeaseContext<Tx>) => Promise<T> | T;

/** Who holds a lease when a claim did not get it. */
export interface LeaseHolder {
  readonly owner: string | null;
  readonly token: bigint;
  readonly expiresAt: Date;
}

/** The outcome of {@link LeaseOperations.runWithLease}. */
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
   * Exactly one caller claims; the others get `{ executed: false, holder }` at once. The winner's
   * task runs outside any transaction with a fencing token and a signal that fires if the lease is
   * lost. On return the run is recorded COMPLETED (or FAILED with the task's error) under the
   * token; a holder that lost its lease gets {@link LeaseLostError} instead, its record refused.
   * A dead holder's lease is taken over by the next claimer after it expires: no sweeper needed.
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
  const ttlMs = integerOption(options.ttlMs ?? 30_000, 'ttlMs', 50, 2_147_483_647);
  const safetyMarginMs = integerOption(
    options.safetyMarginMs ?? Math.min(Math.floor(ttlMs / 5), 5000),
    'safetyMarginMs',
    0,
    ttlMs - 1,
  );
  const renewEveryMs = integerOption(
    options.renewEveryMs ?? Math.floor(ttlMs / 3),
    'renewEveryMs',
    1,
    ttlMs - safetyMarginMs,
  );
  const owner = options.owner ?? `${hostname()}:${process.pid}:${randomUUID().slice(0, 8)}`;
  if (typeof owner !== 'string' || owner.length === 0 || owner.length > 200) {
    throw new LockkitError('OPTION_INVALID', 'owner must be a string of 1 to 200 characters.');
  }
  if (options.heartbeat !== undefined && typeof options.heartbeat !== 'boolean') {
    throw new LockkitError('OPTION_INVALID', 'heartbeat must be a boolean.');
  }
  if (options.signal !== undefined && !(options.signal instanceof AbortSignal)) {
    throw new LockkitError('OPTION_INVALID', 'signal must be an AbortSignal.');
  }
  return { ttlMs, renewEveryMs, safetyMarginMs, owner, heartbeat: options.heartbeat ?? true };
}

const describeError = (error: unknown): string =>
  error instanceof Error ? `${error.name}: ${error.message}` : String(error);

/**
 * Keeps one lease alive: renews it every `renewEveryMs` under its token, and declares it lost when
 * a renewal finds it gone or when the local deadline (last successful send + TTL − margin, on the
 * monotonic clock) passes without a renewal.
 */
class Heartbeat {
  private renewTimer: NodeJS.Timeout | undefined;
  private deadlineTimer: NodeJS.Timeout | undefined;
  private stopped = false;

  constructor(
    private readonly renew: () => Promise<boolean>,
    private readonly s: LeaseSettings,
    private readonly lose: (reason: string) => void,
    claimSentAt: number,
  ) {
    this.armDeadline(claimSentAt);
    if (s.heartbeat) this.schedule();
  }

  private armDeadline(sentAt: number): void {
    clearTimeout(this.deadlineTimer);
    const deadline = sentAt + this.s.ttlMs - this.s.safetyMarginMs;
    this.deadlineTimer = setTimeout(
      () => this.lose('no renewal succeeded before the local deadline'),
      Math.max(0, deadline - performance.now()),
    );
    this.deadlineTimer.unref();
  }

  private schedule(): void {
    this.renewTimer = setTimeout(() => void this.beat(), this.s.renewEveryMs);
    this.renewTimer.unref();
  }

  private async beat(): Promise<void> {
    if (this.stopped) return;
    const sentAt = performance.now();
    try {
      if (!(await this.renew())) {
        this.lose('a renewal found the lease held under another token or expired');
        return;
      }
      if (!this.stopped) this.armDeadline(sentAt);
    } catch {
      // A failed renewal is retried on the next beat; the deadline decides when it is too late.
    }
    if (!this.stopped) this.schedule();
  }

  stop(): void {
    this.stopped = true;
    clearTimeout(this.renewTimer);
    clearTimeout(this.deadlineTimer);
  }
}

/** A lease this process has just claimed. @internal */
export interface ClaimedLease extends LeaseRef {
  readonly tookOver: boolean;
  /** When the claim was sent, on the monotonic clock: the local deadline counts from here. */
  readonly claimSentAt: number;
}

/**
 * Claims the lease row inside a transaction that holds the job's advisory lock: the claimed
 * lease, or who holds it. @internal
 */
export async function claimLease(
  query: QueryFn,
  schema: string,
  namespace: string,
  jobKey: string,
  s: LeaseSettings,
): Promise<ClaimedLease | { holder: LeaseHolder | undefined }> {
  const claimSentAt = performance.now();
  const claim = claimStatement(schema, namespace, jobKey, s.owner, s.ttlMs);
  const [row] = await query(claim.text, claim.params);
  if (row) {
    return {
      namespace,
      jobKey,
      token: BigInt(row.token as string),
      tookOver: row.took_over === true,
      claimSentAt,
    };
  }
  const read = readLeaseStatement(schema, namespace, jobKey);
  const [holder] = await query(read.text, read.params);
  return {
    holder: holder
      ? {
          owner: (holder.owner as string | null) ?? null,
          token: BigInt(holder.token as string),
          expiresAt: new Date(holder.expires_at as string),
        }
      : undefined,
  };
}

/**
 * Runs `task` holding a claimed lease: heartbeat, signal on loss, then records the end under the
 * token, together with `alsoRecord`'s statements in the same transaction. Resolves with the
 * task's result; rejects with the task's error (recorded FAILED) or {@link LeaseLostError}. @internal
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
  },
): Promise<T> {
  const { namespace, jobKey, token } = lease;
  const emit = options.emit;
  const heldSince = performance.now();
  emit?.({ type: 'lease-claimed', namespace, jobKey, token, tookOver: lease.tookOver });
  const lost = new AbortController();
  const lose = (reason: string) => {
    if (!lost.signal.aborted) {
      emit?.({ type: 'lease-lost', namespace, jobKey, token, reason });
      const error = new LeaseLostError(
        `lease ${namespace}/${jobKey} (token ${token}) lost: ${reason}.`,
        token,
      );
      lost.abort(error);
      options.onLost?.(error);
    }
  };
  const renew = renewStatement(schema, namespace, jobKey, token, s.ttlMs);
  const heartbeat = new Heartbeat(
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
  const signal = options.signal ? AbortSignal.any([lost.signal, options.signal]) : lost.signal;
  const context: LeaseContext<Tx> = {
    namespace,
    jobKey,
    token,
    owner: s.owner,
    tookOver: lease.tookOver,
    signal,
    fenced: options.fenced,
  };
  let outcome: { ok: true; result: T } | { ok: false; error: unknown };
  try {
    outcome = { ok: true, result: await task(context) };
  } catch (error) {
    outcome = { ok: false, error };
  } finally {
    heartbeat.stop();
  }
  const record = outcome.ok
    ? { failed: false as const }
    : { failed: true as const, error: describeError(outcome.error) };
  const finish = finishStatement(schema, namespace, jobKey, token, record);
  const recorded =
    !lost.signal.aborted &&
    (await executor.transaction(async ({ query }) => {
      // The lease's own record first: when it is refused, nothing else is written either.
      if ((await query(finish.text, finish.params)).length === 0) return false;
      for (const statement of options.alsoRecord?.(record) ?? []) {
        await query(statement.text, statement.params);
      }
      return true;
    }));
  if (!recorded) {
    const reason = lost.signal.reason instanceof LeaseLostError ? lost.signal.reason.message : '';
    const error = new LeaseLostError(
      `lease ${namespace}/${jobKey} (token ${token}) was lost before the run ended; its ${outcome.ok ? 'completion' : 'failure'} was not recorded. ${reason}`.trim(),
      token,
      outcome.ok ? {} : { cause: outcome.error },
    );
    if (!lost.signal.aborted) options.onLost?.(error);
    throw error;
  }
  emit?.({
    type: 'lease-finished',
    namespace,
    jobKey,
    token,
    failed: !outcome.ok,
    heldMs: performance.now() - heldSince,
  });
  if (!outcome.ok) throw outcome.error;
  return outcome.result;
}

/**
 * The lease operations over an executor. `withTryLock` is the lock client's transaction-scoped
 * try-lock, which the claim runs under; `schema` is the quoted schema name.
 */
export function leaseOperations<Tx>(
  executor: LockExecutor<Tx, unknown>,
  withTryLock: <T>(
    key: LockKey,
    task: (query: QueryFn) => Promise<T>,
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
    LockKey.fromNames(lease.namespace, lease.jobKey);
    if (typeof lease.token !== 'bigint' || lease.token < 1n || lease.token >= 2n ** 63n)
      throw new LockkitError('OPTION_INVALID', 'The lease token must be a positive int8 bigint.');
    if (typeof task !== 'function')
      throw new LockkitError('OPTION_INVALID', 'The task must be a function.');
    const fence = fenceStatement(schema, lease.namespace, lease.jobKey, lease.token);
    return executor.transaction(async ({ query, tx }) => {
      const rows = await query(fence.text, fence.params);
      if (rows.length === 0) {
        throw new LeaseLostError(
          `fenced write refused: ${lease.namespace}/${lease.jobKey} is no longer held under token ${lease.token}.`,
          lease.token,
        );
      }
      return task(tx, query);
    });
  }

  async function runWithLease<T>(
    namespace: string,
    jobKey: string,
    task: LeaseTask<Tx, T>,
    options: LeaseOptions = {},
  ): Promise<LeaseResult<T>> {
    const key = LockKey.fromNames(namespace, jobKey);
    if (typeof task !== 'function')
      throw new LockkitError('OPTION_INVALID', 'The task must be a function.');
    const s = leaseSettings(options);
    options.signal?.throwIfAborted();
    const claimed = await withTryLock(key, (query) =>
      claimLease(query, schema, namespace, jobKey, s),
    );
    if (!claimed.executed) return { executed: false, holder: undefined };
    if ('holder' in claimed.result) return { executed: false, holder: claimed.result.holder };
    const lease = claimed.result;
    const result = await holdLease(executor, schema, lease, s, task, {
      ...(options.signal !== undefined && { signal: options.signal }),
      ...(emit !== undefined && { emit }),
      fenced: (fencedTask) => withFencedWrite(lease, fencedTask),
    });
    return { executed: true, result, token: lease.token };
  }

  return { runWithLease, withFencedWrite };
}
