/**
 * The engine self-test: before a lock client trusts its first lock, it checks that the server
 * really holds advisory locks. Some engines answer `pg_try_advisory_xact_lock` with `true` and hold
 * nothing (CockroachDB did for years; YugabyteDB can be told to; a stub function ahead of
 * `pg_catalog` on the `search_path` does the same; a router that sends each transaction to another
 * server splits one lock table in two): on such a server every caller "wins" and every task runs
 * everywhere at once.
 *
 * The test: session A (a transaction) takes a fresh random key, in both key spaces; while it holds
 * them, session B (a second concurrent transaction on the same executor) must see them in
 * `pg_locks` granted to A's backend, and must be refused them. Both then roll back together, so
 * nothing is left behind. It costs two statements, each pipelined with its BEGIN where the
 * executor can, and the two rollbacks: four round trips, three one after the other (B may also
 * open a new pooled connection).
 *
 * With one connection only (a single client, a pool of one, or a pool so busy that B gets no
 * connection within {@link SECOND_SESSION_BUDGET_MS}), B cannot run while A is open: A then checks
 * its own lock in `pg_locks`, which still catches a stub or an engine that ignores advisory locks,
 * but not a router that splits sessions. The result says which check ran.
 *
 * @packageDocumentation
 */
import { randomBytes } from 'node:crypto';
import { EngineLocksNotRealError, LockkitError } from './errors.js';
import type { LockExecutor, Row, TransactionContext } from './executor.js';
import { LockKey } from './keys.js';
import { fromPostgresError } from './postgres-errors.js';
import {
  type SelfTestKeys,
  selfTestSameSessionStatement,
  selfTestSecondSessionStatement,
  selfTestTakeStatement,
} from './sql/self-test.js';

/** The namespace of the self-test's keys: lockkit's own, never a user's. */
export const SELF_TEST_NAMESPACE = 'lockkit-engine-self-test';

/**
 * How long the self-test waits for its second session to start (a pooled connection, BEGIN and
 * its statement) before it settles for the one-session check. Long enough for a new TLS
 * connection to a distant server; short enough that a pool of one the executor did not declare
 * costs a start-up second, not a hang.
 */
export const SECOND_SESSION_BUDGET_MS = 1000;

/** What one engine self-test saw. */
export interface EngineSelfTestResult {
  /** Whether the server's advisory locks are real: held, visible to others, exclusive. */
  readonly real: boolean;
  /**
   * `'two-sessions'`: a second session looked for the lock and tried to take it (the full test).
   * `'one-session'`: only the first session's own view of `pg_locks` was checked, because no
   * second session could be had while it was open (see {@link EngineSelfTestResult.found}).
   */
  readonly method: 'two-sessions' | 'one-session';
  /** What was seen, in words (for a failure: what gave the fake away). */
  readonly found: string;
  /** The server's `version()`, when it could be read. */
  readonly server: string | undefined;
  /** How long the self-test took, in milliseconds. */
  readonly elapsedMs: number;
}

/** A fresh pair of keys for one run: random, so concurrent self-tests never meet. */
export function selfTestKeys(): SelfTestKeys {
  const pair = LockKey.fromNames(SELF_TEST_NAMESPACE, randomBytes(12).toString('hex'));
  const [high, low] = pair.pair as readonly [number, number];
  return {
    pair,
    int8: LockKey.fromBigInt(BigInt.asIntN(64, (BigInt(high) << 32n) | BigInt(low >>> 0))),
  };
}

/** Carries a transaction callback's result out through a rejection, so the executor rolls back. */
class RolledBack {
  constructor(readonly value: unknown) {}
}

/** Runs `fn` after `opening` in one transaction of `executor`, then ROLLBACK; resolves with `fn`'s result. */
async function rolledBack<T>(
  executor: LockExecutor,
  opening: string,
  fn: (ctx: TransactionContext<unknown>, openingRows: Row[]) => Promise<T>,
): Promise<T> {
  const body = async (ctx: TransactionContext<unknown>, rows: Row[]): Promise<never> => {
    throw new RolledBack(await fn(ctx, rows));
  };
  try {
    if (executor.pipelinedTransaction) await executor.pipelinedTransaction(opening, body);
    else await executor.transaction(async (ctx) => body(ctx, await ctx.query(opening)));
  } catch (error) {
    if (error instanceof RolledBack) return error.value as T;
    throw error;
  }
  throw new LockkitError(
    'EXECUTOR_INVALID',
    `The ${executor.name} executor resolved a transaction whose callback had rejected.`,
  );
}

/** A promise and its resolver. */
function deferred<T>(): { promise: Promise<T>; resolve: (value: T) => void } {
  let resolve!: (value: T) => void;
  const promise = new Promise<T>((r) => {
    resolve = r;
  });
  return { promise, resolve };
}

const describe = (error: unknown): string =>
  error instanceof Error ? error.message : String(error);

/** What the second session's row says; failures first. */
function judgeTwoSessions(holder: Row, second: Row): { real: boolean; found: string } {
  const problems: string[] = [];
  if (second.pair_taken === true || second.int8_taken === true) {
    const which =
      second.pair_taken === true && second.int8_taken === true
        ? ''
        : second.pair_taken === true
          ? ' (int4-pair key)'
          : ' (int8 key)';
    problems.push(`a second session took the same lock${which}`);
  }
  if (second.pair_seen !== true || second.int8_seen !== true) {
    problems.push(
      `the lock is not in pg_locks as granted to the first session's backend ${String(holder.pid)}`,
    );
  }
  if (problems.length === 0) {
    return {
      real: true,
      found: `a second session (backend ${String(second.pid)}) saw the lock granted to the first (backend ${String(holder.pid)}) in pg_locks, and was refused it`,
    };
  }
  return { real: false, found: problems.join('; ') };
}

/**
 * Runs the engine self-test once on `executor` (see the module's description). Resolves with the
 * verdict, real or not; rejects only when it could not be run (the connection failed, the server
 * refused a statement), with the error mapped as lock errors are.
 *
 * Never leaves a lock or a transaction behind: both sessions roll back, and a second session that
 * started too late rolls back at once when it does start.
 */
export async function runEngineSelfTest(
  executor: LockExecutor,
  secondSessionBudgetMs = SECOND_SESSION_BUDGET_MS,
): Promise<EngineSelfTestResult> {
  const started = performance.now();
  const keys = selfTestKeys();
  const opened = deferred<Row>();
  // What session A does once it has reported: nothing more, or the one-session check.
  const next = deferred<
    ((query: TransactionContext<unknown>['query']) => Promise<Row>) | undefined
  >();
  const a = rolledBack(executor, selfTestTakeStatement(keys), async (ctx, rows) => {
    opened.resolve(rows[0] ?? {});
    const then = await next.promise;
    return then === undefined ? undefined : then(ctx.query);
  });
  let b: Promise<unknown> | undefined;
  try {
    const holder = await Promise.race([opened.promise, a.then(() => undefined)]);
    if (holder === undefined) throw new LockkitError('EXECUTOR_INVALID', 'no self-test row');
    const server = typeof holder.server === 'string' ? holder.server : undefined;
    const result = (method: EngineSelfTestResult['method'], real: boolean, found: string) => ({
      real,
      method,
      found,
      server,
      elapsedMs: performance.now() - started,
    });
    // The verdict of a check made on the first session's backend alone: `seen`'s `pair_seen` and
    // `int8_seen` say whether pg_locks shows both keys granted to it; `why` says why one session.
    const oneSession = (seen: Row, why: string) =>
      seen.pair_seen === true && seen.int8_seen === true
        ? result(
            'one-session',
            true,
            `the lock is in pg_locks, granted to the session's own backend ${String(holder.pid)} (checked on one session only: ${why})`,
          )
        : result(
            'one-session',
            false,
            `the lock is not in pg_locks, though the session was told it had it (checked on one session only: ${why})`,
          );
    if (holder.pair !== true || holder.int8 !== true) {
      next.resolve(undefined);
      await a;
      return result(
        'two-sessions',
        false,
        `the first session was refused a fresh random key that no one else holds (pair: ${String(holder.pair)}, int8: ${String(holder.int8)})`,
      );
    }

    let oneSessionWhy = 'the executor has one connection only';
    if (!executor.singleConnection) {
      // Started here, outside A's callback: a call from inside it would be a nested call.
      let abandoned = false;
      const seen = deferred<Row>();
      const second = rolledBack(
        executor,
        selfTestSecondSessionStatement(keys, Number(holder.pid)),
        async (_ctx, rows) => {
          // Reported before B's rollback, so that both sessions end at the same time.
          if (!abandoned) seen.resolve(rows[0] ?? {});
        },
      );
      b = second.catch(() => {});
      let timer: NodeJS.Timeout | undefined;
      const late = new Promise<{ late: true }>((resolve) => {
        timer = setTimeout(() => resolve({ late: true }), secondSessionBudgetMs);
      });
      const outcome = await Promise.race([
        seen.promise.then((row) => ({ row })),
        second.then(
          () => ({ error: new Error('the second session ended without its row') }),
          (error: unknown) => ({ error }),
        ),
        late,
      ]);
      clearTimeout(timer);
      if ('row' in outcome && outcome.row.pid === holder.pid) {
        // Both transactions ran on one backend: an executor that shares one connection between
        // transactions without saying so (`singleConnection`). Not a sign of fake locks — the
        // "second" session holds what the first does — but then its row is the one-session check.
        next.resolve(undefined);
        await a;
        return oneSession(
          outcome.row,
          `both transactions ran on backend ${String(holder.pid)}: the executor shares one connection`,
        );
      }
      if ('row' in outcome) {
        next.resolve(undefined);
        await a;
        const verdict = judgeTwoSessions(holder, outcome.row);
        return result('two-sessions', verdict.real, verdict.found);
      }
      abandoned = true;
      oneSessionWhy =
        'error' in outcome
          ? `a second session could not be opened while the first was open (${describe(outcome.error)})`
          : `no second session started within ${secondSessionBudgetMs} ms while the first was open`;
    }

    next.resolve((query) => query(selfTestSameSessionStatement(keys)).then((r) => r[0] ?? {}));
    return oneSession((await a) as Row, oneSessionWhy);
  } catch (error) {
    throw fromPostgresError(error, 'engine self-test');
  } finally {
    // Whatever happened, A is told to end, and nothing of the self-test is left running.
    next.resolve(undefined);
    await a.catch(() => {});
    await b;
  }
}

/** The error a lock call gets from a server whose locks are not real. */
function refusal(executor: LockExecutor, result: EngineSelfTestResult): EngineLocksNotRealError {
  return new EngineLocksNotRealError(
    `The server behind the ${executor.name} executor does not really hold advisory locks: ${result.found}. Every caller would get every lock at once, so lockkit refuses to run tasks on it. Server: ${result.server ?? 'unknown'}. Point lockkit at a real PostgreSQL primary, directly or through a pooler that keeps each transaction on one server.`,
    result.found,
    result.server,
  );
}

/**
 * One lock client's trust in its server: the engine self-test run once (concurrent first calls
 * share it), its verdict kept for the client's lifetime — a pass lets every later call through
 * without an await, a failure refuses every later call. A self-test that could not run (a lost
 * connection) is not a verdict: the call fails with that error and the next call tries again.
 */
export class EngineTrust {
  private verdict: EngineSelfTestResult | undefined;
  private running: Promise<EngineSelfTestResult> | undefined;

  /**
   * @param executor - the client's executor.
   * @param enabled - `false` (the `engineSelfTest: false` option): lock calls do not run it.
   */
  constructor(
    private readonly executor: LockExecutor,
    private readonly enabled: boolean,
  ) {}

  /** True when lock calls may go on at once: the self-test is off, or passed. */
  get trusted(): boolean {
    return this.verdict === undefined ? !this.enabled : this.verdict.real;
  }

  /** The self-test's result, run now if it has not run yet for this client. */
  result(): Promise<EngineSelfTestResult> {
    if (this.verdict) return Promise.resolve(this.verdict);
    this.running ??= runEngineSelfTest(this.executor).then(
      (verdict) => {
        this.verdict = verdict;
        this.running = undefined;
        return verdict;
      },
      (error: unknown) => {
        this.running = undefined;
        throw error;
      },
    );
    return this.running;
  }

  /**
   * Runs the self-test (once for this client, even with `engineSelfTest: false`) and resolves with
   * its result; rejects with {@link EngineLocksNotRealError} when the server's locks are not real,
   * or with the error that kept the self-test from running.
   */
  async verify(): Promise<EngineSelfTestResult> {
    const verdict = await this.result();
    if (!verdict.real) throw refusal(this.executor, verdict);
    return verdict;
  }

  /** What a lock call awaits before it trusts its first lock, when {@link EngineTrust.trusted} is false. */
  async ensure(): Promise<void> {
    if (!this.trusted) await this.verify();
  }
}
