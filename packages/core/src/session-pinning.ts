/**
 * Whether a session connection stays pinned to one server backend: a direct connection or a
 * session-mode pooler (session locks are safe), or a transaction-mode pooler (they are not).
 *
 * What PgBouncer does, in both modes (the test-db package checks it against a real one): it
 * answers every client's startup with a BackendKeyData pid of its own invention — random bits,
 * negative half the time on 1.18 — so a pid that differs from `pg_backend_pid()` proves a pooler
 * is in the path, and says nothing about its mode. What differs is what happens while a client
 * is idle: in session mode its server backend stays its own (no other client ever runs on it);
 * in transaction mode the backend goes back to the pool at the end of each transaction and the
 * next client that asks gets it (PgBouncer reuses the most recently freed server first, or with
 * `server_round_robin` the oldest).
 *
 * So the check is behavioural. Behind a pooler, this connection reads its backend P, then —
 * while it sits idle — other connections of the same pool run short transactions that read
 * their own backend and P's entry in `pg_stat_activity`, in three rounds of one, two and three
 * transactions; then this connection reads its backend again. Proof of a transaction pooler:
 * another client lands on P, P is busy or has run someone else's statement while this connection
 * was idle, or this connection's own statements moved off P. With neither LIFO nor round-robin
 * reuse can a quiet transaction-mode pool keep P from the others through all three rounds. Only a
 * pool that passes every round is taken for a session pooler — and even then every lock and
 * unlock statement lockkit sends stays guarded to run on P only, so a connection that ever moves
 * is caught and session scope refused from then on.
 *
 * @packageDocumentation
 */
import { randomBytes } from 'node:crypto';
import type { LockExecutor, QueryFn, SessionContext } from './executor.js';
import { BACKEND_PID } from './sql/locks.js';

/** What {@link detectPooler} found between the driver and the server. */
export type PoolerVerdict =
  /** The driver's startup pid is the server's: no pooler. */
  | { readonly kind: 'direct' }
  /** A pooler that keeps each client connection on one server backend: session locks are safe. */
  | { readonly kind: 'session-pooler' }
  /** A pooler that moves clients between server backends: session locks are unsafe. */
  | { readonly kind: 'transaction-pooler'; readonly evidence: string }
  /** A pooler whose mode could not be checked: treated as unsafe for session locks. */
  | { readonly kind: 'unverified'; readonly reason: string };

/** Options of {@link detectPooler}. */
export interface DetectPoolerOptions {
  /**
   * How long the check waits for a second connection of the executor's pool, in ms (default
   * 5000): with a pool of one, none comes while the session holds it, and the pooler's mode stays
   * unverified.
   */
  readonly probeTimeoutMs?: number;
}

const DEFAULT_PROBE_TIMEOUT_MS = 5000;

/** P's state seen from another connection: its own backend, and P's activity entry. */
const PEEK = `SELECT pg_backend_pid() AS pid, a.state, a.query
                FROM (SELECT $1::int4 AS pid) p LEFT JOIN pg_stat_activity a ON a.pid = p.pid`;

const pidOf = async (query: QueryFn, text: string): Promise<number> =>
  Number((await query(text))[0]?.pid);

class ProbeTimeout {}

/**
 * Checks, from an open session connection whose driver pid differs from its server backend,
 * whether the pooler pins the connection to that backend. `firstPid` is the backend just read on
 * it. Never throws for what it finds; rejects only when the session connection itself fails.
 */
async function probe(
  executor: LockExecutor,
  session: QueryFn,
  firstPid: number,
  timeoutMs: number,
): Promise<PoolerVerdict> {
  const token = randomBytes(6).toString('hex');
  // A statement text only this connection sends: P's last query, while nobody else touched P.
  const mark = (round: number) => `${BACKEND_PID} /* lockkit pooler check ${token} ${round} */`;
  if ((await pidOf(session, mark(0))) !== firstPid) {
    return moved(firstPid);
  }
  for (let round = 1; round <= 3; round++) {
    for (let i = 0; i < round; i++) {
      let timer: NodeJS.Timeout | undefined;
      const peeked = executor.transaction(({ query }) => query(PEEK, [firstPid]));
      peeked.catch(() => {}); // settles after a timeout too; its answer is no longer wanted
      let row: Record<string, unknown> | undefined;
      try {
        const rows = await Promise.race([
          peeked,
          new Promise<never>((_, reject) => {
            timer = setTimeout(() => reject(new ProbeTimeout()), timeoutMs);
          }),
        ]);
        row = rows[0];
      } catch (error) {
        if (!(error instanceof ProbeTimeout)) throw error;
        return {
          kind: 'unverified',
          reason: `no second connection of the ${executor.name} executor's pool answered within ${timeoutMs} ms (the check runs short transactions on one while this session connection sits idle; a pool of one cannot)`,
        };
      } finally {
        clearTimeout(timer);
      }
      const other = Number(row?.pid);
      if (other === firstPid) {
        return {
          kind: 'transaction-pooler',
          evidence: `another client's transaction ran on backend ${firstPid} while this connection, pinned there a moment before, sat idle`,
        };
      }
      if (row?.state === null || row?.state === undefined) {
        return {
          kind: 'unverified',
          reason: `backend ${firstPid} ended during the check`,
        };
      }
      if (row.state !== 'idle') {
        return {
          kind: 'transaction-pooler',
          evidence: `backend ${firstPid} was ${String(row.state)} for another client while this connection, pinned there a moment before, sat idle`,
        };
      }
      // P's last statement must still be this connection's own. Unknown without
      // track_activities ('') or to another role ('<insufficient privilege>'): no evidence then.
      const text = typeof row.query === 'string' ? row.query : '';
      if (text !== '' && !text.startsWith('<') && !text.includes(`${token} ${round - 1} */`)) {
        return {
          kind: 'transaction-pooler',
          evidence: `backend ${firstPid} ran another client's statement while this connection, pinned there a moment before, sat idle`,
        };
      }
    }
    const now = await pidOf(session, mark(round));
    if (now !== firstPid) return moved(firstPid, now);
  }
  return { kind: 'session-pooler' };
}

const moved = (from: number, to?: number): PoolerVerdict => ({
  kind: 'transaction-pooler',
  evidence: `this connection's statements moved from backend ${from}${to === undefined ? '' : ` to backend ${to}`} between two of its own statements`,
});

/**
 * Tells, on one session connection, whether it reaches Postgres directly, through a pooler in
 * session mode, or through one in transaction mode (see the module comment for how). Costs one
 * round trip on a direct connection; behind a pooler, four statements on the session and six
 * short transactions on other connections of the pool. `driverPid` is the pid the driver was
 * given at connect.
 */
export async function pinningOf(
  executor: LockExecutor,
  session: QueryFn,
  driverPid: number,
  options: DetectPoolerOptions = {},
): Promise<{ readonly verdict: PoolerVerdict; readonly backendPid: number }> {
  const backendPid = await pidOf(session, BACKEND_PID);
  if (backendPid === driverPid) return { verdict: { kind: 'direct' }, backendPid };
  const timeoutMs = options.probeTimeoutMs ?? DEFAULT_PROBE_TIMEOUT_MS;
  return { verdict: await probe(executor, session, backendPid, timeoutMs), backendPid };
}

/**
 * Opens one session on `executor` and tells what is between the driver and the server (see
 * {@link PoolerVerdict}). Needs the session capability and a driver that reports its startup pid
 * (`@lockkit/pg`, `@lockkit/postgres`); otherwise resolves `unverified`.
 *
 * @example
 * ```ts
 * const { kind } = await detectPooler(pgExecutor(pool));
 * if (kind !== 'direct' && kind !== 'session-pooler') console.warn('session locks will be refused');
 * ```
 */
export async function detectPooler(
  executor: LockExecutor,
  options: DetectPoolerOptions = {},
): Promise<PoolerVerdict> {
  if (typeof executor.session !== 'function') {
    return {
      kind: 'unverified',
      reason: `the ${executor.name} executor has no session capability`,
    };
  }
  return executor.session(async (ctx) => {
    if (ctx.backendPid === undefined) {
      return {
        kind: 'unverified',
        reason: `the ${executor.name} driver does not report the backend pid it was given at connect`,
      };
    }
    return (await pinningOf(executor, ctx.query, ctx.backendPid, options)).verdict;
  });
}

/** Which backend a session connection's lock statements must reach, or why session scope is refused. */
export type SessionPin =
  | { readonly pid: number | undefined }
  | { readonly refused: string; readonly driverPid: number };

/**
 * A lock client's memory of what is behind its executor: checked on the first session call
 * (once), then each connection's backend remembered, so that later calls cost nothing more on a
 * direct connection and at most one round trip per new connection behind a session pooler.
 * @internal
 */
export class SessionPinning {
  private verdict: Promise<PoolerVerdict> | undefined;
  /** Behind a session pooler: each connection's own backend, by the driver's handle. */
  private readonly backends = new WeakMap<object, number>();

  constructor(
    private readonly executor: LockExecutor,
    private readonly options: DetectPoolerOptions = {},
  ) {}

  /**
   * The backend pid this session connection's lock and unlock statements must run on (they are
   * guarded with it): the driver's own pid on a direct connection, the pinned backend behind a
   * session pooler, `undefined` when the driver reports none (nothing to check against). Or why
   * session scope is refused.
   */
  async pin(ctx: SessionContext<unknown>): Promise<SessionPin> {
    const driverPid = ctx.backendPid;
    if (driverPid === undefined) return { pid: undefined };
    const handle =
      typeof ctx.session === 'object' && ctx.session !== null ? ctx.session : undefined;
    const known = handle && this.backends.get(handle);
    if (known !== undefined) return { pid: known };
    let verdict = this.verdict && (await this.verdict);
    if (verdict?.kind === 'direct') return { pid: driverPid };
    let backendPid: number | undefined;
    if (verdict === undefined) {
      const checked = pinningOf(this.executor, ctx.query, driverPid, this.options);
      this.verdict = checked.then((c) => c.verdict);
      // A failed check (the connection broke) is not a verdict: the next call checks again.
      this.verdict.catch(() => {
        this.verdict = undefined;
      });
      ({ verdict, backendPid } = await checked);
    }
    switch (verdict.kind) {
      case 'direct':
        return { pid: driverPid };
      case 'session-pooler': {
        backendPid ??= await pidOf(ctx.query, BACKEND_PID);
        if (handle) this.backends.set(handle, backendPid);
        return { pid: backendPid };
      }
      case 'transaction-pooler':
        return {
          driverPid,
          refused: `the driver was given backend pid ${driverPid} at connect, but the server runs this connection on ${backendPid === undefined ? 'another backend' : `backend ${backendPid}`}, and a transaction pooler is in between: ${verdict.evidence}.`,
        };
      default:
        return {
          driverPid,
          refused: `the driver was given backend pid ${driverPid} at connect, but the server runs this connection on ${backendPid === undefined ? 'another backend' : `backend ${backendPid}`}: a pooler is in between, and its mode could not be checked (${verdict.reason}).`,
        };
    }
  }
}
