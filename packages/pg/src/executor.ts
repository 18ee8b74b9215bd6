/**
 * The node-postgres executor: transactions and sessions on connections from a `pg.Pool`, or on
 * one `pg.Client` used by one operation at a time.
 *
 * The driver types are declared structurally (what we call, nothing more), so this package does
 * not depend on `@types/pg` and accepts any compatible pool.
 */
import {
  CommitRolledBackError,
  ConnectionLostError,
  type LockExecutor,
  LockkitError,
  type QueryFn,
  type Row,
  type SessionContext,
  type TransactionContext,
} from '@lockkit/core';
import {
  ConnectionFate,
  FateTransactionContext,
  inTransactionBlock,
  inTransactionFrom,
  isConnectionLoss,
  NestedCallGuard,
  sendCancelRequest,
  slotOf,
} from '@lockkit/core/adapter';

/** The part of a `pg` query result we read. */
export interface PgResultLike {
  readonly rows: Row[];
  /** The command tag: `'ROLLBACK'` for a COMMIT that rolled back. */
  readonly command?: string | null;
}

/** The part of a `pg.Client` / `pg.PoolClient` we use. */
export interface PgClientLike {
  /** The backend pid from the server's BackendKeyData at connect (pg sets it on the client). */
  readonly processID?: number | null;
  /** BackendKeyData's secret key, for the protocol's CancelRequest. */
  readonly secretKey?: number | null;
  /** The server the client connected to (a host name, or a Unix socket directory). */
  readonly host?: string;
  readonly port?: number;
  /** The transaction status of the last ReadyForQuery: `'I'` idle, `'T'` open, `'E'` failed. */
  getTransactionStatus?(): string | null;
  query(text: string, values?: unknown[]): Promise<PgResultLike | PgResultLike[]>;
  on(event: 'error', listener: (error: Error) => void): unknown;
  on(event: 'end', listener: () => void): unknown;
}

/** The part of a `pg.PoolClient` we use: a client that goes back to its pool. */
export interface PgPoolClientLike extends PgClientLike {
  /** With an error (or `true`), the pool destroys the connection instead of reusing it. */
  release(error?: Error | boolean): void;
}

/** The part of a `pg.Pool` we use. */
export interface PgPoolLike {
  connect(): Promise<PgPoolClientLike>;
}

/** Options of {@link pgExecutor}. */
export interface PgExecutorOptions {
  /** Name reported in errors; default `'pg'`. */
  readonly name?: string;
  /**
   * Declare that the pool reaches Postgres through a transaction-pooling proxy (PgBouncer in
   * transaction mode, Supavisor, RDS Proxy, pgcat): session scope is then refused before any SQL.
   * lockkit also detects PgBouncer on its own (see the core README), but declaring is certain.
   */
  readonly transactionPooler?: boolean;
}

interface Lease<C extends PgClientLike> {
  readonly client: C;
  readonly done: (broken: Error | undefined) => void;
  /** True for a single client (it cannot be discarded, and the caller may be using it). */
  readonly single: boolean;
}

/** The protocol cancel of whatever `client` is running; undefined when the driver lacks the keys. */
function interrupter(client: PgClientLike): (() => Promise<void>) | undefined {
  const { processID, secretKey, host, port } = client;
  if (typeof processID !== 'number' || typeof secretKey !== 'number') return undefined;
  if (typeof host !== 'string' || typeof port !== 'number') return undefined;
  return () => sendCancelRequest({ host, port, pid: processID, secretKey });
}

/** Watches one checked-out connection: its fate turns aborted when the connection errors or ends. */
function watch(client: PgClientLike): {
  fate: ConnectionFate;
  query: QueryFn;
  /** Sends COMMIT; true when the server answered ROLLBACK (the transaction had failed). */
  commit: () => Promise<boolean>;
  queryFirstRows: (text: string) => Promise<Row[]>;
  unwatch: () => void;
} {
  const fate = new ConnectionFate();
  const slot = slotOf(client);
  slot.current = fate;
  // A multi-statement simple query yields one result per statement: `pick` chooses whose rows.
  const run = async (
    text: string,
    params: readonly unknown[] | undefined,
    pick: 'first' | 'last',
  ) => {
    try {
      const result = await client.query(text, params === undefined ? undefined : [...params]);
      if (!Array.isArray(result)) return result.rows as Row[];
      return ((pick === 'first' ? result[0] : result.at(-1))?.rows ?? []) as Row[];
    } catch (error) {
      if (isConnectionLoss(error)) fate.abort(error);
      throw error;
    }
  };
  const query: QueryFn = (text, params) => run(text, params, 'last');
  return {
    fate,
    query,
    commit: async () => {
      try {
        const result = await client.query('COMMIT');
        return !Array.isArray(result) && result.command === 'ROLLBACK';
      } catch (error) {
        if (isConnectionLoss(error)) fate.abort(error);
        throw error;
      }
    },
    queryFirstRows: (text) => run(text, undefined, 'first'),
    unwatch: () => {
      if (slot.current === fate) slot.current = undefined;
    },
  };
}

/** The part of pg's protocol connection (`client.connection`, an EventEmitter) we listen to. */
interface PgConnectionEvents {
  on(event: string, listener: (message: PgProtocolMessage) => void): unknown;
}

/** ReadyForQuery's `status`, CommandComplete's `text` (the command tag). */
interface PgProtocolMessage {
  readonly status?: unknown;
  readonly text?: unknown;
}

/** What {@link followerOf} keeps per client: whether lockkit's transaction on it has ended. */
interface TransactionFollower {
  /** Whether a transaction is being followed; the listeners ignore the connection otherwise. */
  following: boolean;
  state: boolean | undefined;
  /** `ctx.ended`, made once per client. */
  readonly ended: () => boolean | undefined;
  readonly stop: () => void;
}

/** One follower per client: its listeners stay on the connection, so a run adds none. */
const followers = new WeakMap<object, TransactionFollower | null>();

/**
 * Follows `client`'s transactions. While `following`, `ended` turns true once a ReadyForQuery
 * reported the connection idle or a statement completed as COMMIT (COMMIT AND CHAIN too) or
 * PREPARE TRANSACTION: the transaction ended, even if another began after it. After a ROLLBACK
 * tag (a whole ROLLBACK AND CHAIN, or only ROLLBACK TO SAVEPOINT) or an error (perhaps a failed
 * COMMIT) it is undefined: core asks the server. Undefined when pg has no protocol events.
 */
function followerOf(client: PgClientLike): TransactionFollower | undefined {
  const known = followers.get(client);
  if (known !== undefined) return known ?? undefined;
  const connection = (client as { readonly connection?: Partial<PgConnectionEvents> }).connection;
  if (typeof connection?.on !== 'function') {
    followers.set(client, null);
    return undefined;
  }
  const follower: TransactionFollower = {
    following: false,
    state: false,
    ended: () => follower.state,
    stop: () => {
      follower.following = false;
    },
  };
  const events = connection as PgConnectionEvents;
  events.on('readyForQuery', (message) => {
    if (follower.following && message?.status === 'I') follower.state = true;
  });
  events.on('commandComplete', (message) => {
    if (!follower.following) return;
    const tag = message?.text;
    if (tag === 'COMMIT' || tag === 'PREPARE TRANSACTION') follower.state = true;
    else if (tag === 'ROLLBACK' && follower.state === false) follower.state = undefined;
  });
  // A statement that failed may have been the task's own COMMIT (a deferred constraint) or
  // PREPARE TRANSACTION: its promise settles before the ReadyForQuery that would tell.
  events.on('errorMessage', () => {
    if (follower.following && follower.state === false) follower.state = undefined;
  });
  followers.set(client, follower);
  return follower;
}

/**
 * Follows `client`'s transaction from now on (see {@link followerOf}). Without pg's protocol
 * events, the last ReadyForQuery status says at least whether a transaction ended and none
 * replaced it; undefined when pg reports neither.
 */
function followTransaction(
  client: PgClientLike,
): { readonly ended: () => boolean | undefined; readonly stop: () => void } | undefined {
  const follower = followerOf(client);
  if (follower) {
    follower.state = false;
    follower.following = true;
    return follower;
  }
  if (typeof client.getTransactionStatus !== 'function') return undefined;
  return { ended: () => client.getTransactionStatus?.() === 'I', stop: () => {} };
}

function isPool(handle: PgPoolLike | PgClientLike): handle is PgPoolLike {
  return (
    typeof (handle as Partial<PgPoolLike>).connect === 'function' &&
    !('release' in handle) &&
    typeof (handle as { totalCount?: unknown }).totalCount === 'number'
  );
}

/**
 * A {@link LockExecutor} over a `pg.Pool` (each operation on its own pooled connection, always
 * released, destroyed when it broke) or over one connected `pg.Client` (operations take turns on
 * it, so two tasks never share the connection at once).
 *
 * Capabilities: transaction, session, pipelined BEGIN + first statement (one simple-protocol
 * round trip), and a first statement + BEGIN in one round trip (one-round-trip skips).
 *
 * @example
 * ```ts
 * import pg from 'pg';
 * import { createLockClient } from '@lockkit/core';
 * import { pgExecutor } from '@lockkit/pg';
 * const locks = createLockClient(pgExecutor(new pg.Pool()));
 * ```
 */
export function pgExecutor<C extends PgPoolClientLike = PgPoolClientLike>(
  pool: PgPoolLike & { connect(): Promise<C> },
  options?: PgExecutorOptions,
): LockExecutor<C, C>;
export function pgExecutor<C extends PgClientLike>(
  client: C,
  options?: PgExecutorOptions,
): LockExecutor<C, C>;
export function pgExecutor(
  handle: PgPoolLike | PgClientLike,
  options: PgExecutorOptions = {},
): LockExecutor<PgClientLike, PgClientLike> {
  const name = options.name ?? 'pg';
  const leases = isPool(handle) ? poolLeases(handle) : clientLeases(handle as PgClientLike);
  // A pool of one or a single client: a lockkit call from inside a task of this executor could
  // never get a connection. The token is switched off when its operation ends, so timers made
  // inside a task do not carry it on.
  const onlyOne = !isPool(handle) || (handle as { options?: { max?: unknown } }).options?.max === 1;
  const nested = new NestedCallGuard(name, onlyOne, handle);
  const acquire = (): Promise<Lease<PgClientLike>> => {
    nested.check();
    return leases();
  };
  const exclusively = <T>(fn: () => Promise<T>): Promise<T> => nested.run(fn);

  /** A single client the caller left inside a transaction of its own. */
  const callerTransactionOpen = (lease: Lease<PgClientLike>): boolean => {
    return lease.single && inTransactionBlock(lease.client.getTransactionStatus?.());
  };
  /** A single client whose connection died (pg keeps its last transaction status). */
  const deadClientError = (lease: Lease<PgClientLike>): ConnectionLostError | undefined => {
    if (!lease.single) return undefined;
    const { lost } = slotOf(lease.client);
    if (lost === undefined) return undefined;
    return new ConnectionLostError(
      'The pg.Client given to lockkit has lost its connection (its backend died or it was ended): connect a new client.',
      { cause: lost },
    );
  };
  const callerTransactionError = () =>
    new LockkitError(
      'CALLER_TRANSACTION_OPEN',
      `The ${name} executor's client is inside a transaction of the caller's own: lockkit's COMMIT would commit the caller's work (and its ROLLBACK undo it). Run lockkit on a pool, or outside your transaction.`,
    );

  async function inTransaction<T>(
    opening: string | undefined,
    fn: (ctx: TransactionContext<PgClientLike>, openingRows: Row[]) => Promise<T>,
    beginAfter = false,
    beforeSend?: () => void,
  ): Promise<T> {
    const lease = await acquire();
    const { fate, query, queryFirstRows, commit, unwatch } = watch(lease.client);
    let broken: Error | undefined;
    let interrupted = false;
    // With other connections in the pool, core cancels from one of them (guarded); alone, the
    // protocol's own cancel is the only way.
    const interrupt = onlyOne ? interrupter(lease.client) : undefined;
    // Nothing sent yet: nothing to roll back.
    let inTransactionBlock = false;
    let following: ReturnType<typeof followTransaction>;
    try {
      const dead = deadClientError(lease);
      if (dead) throw dead;
      if (callerTransactionOpen(lease)) throw callerTransactionError();
      beforeSend?.();
      // `BEGIN; opening` that fails leaves an aborted transaction; `opening; BEGIN` that fails
      // leaves none (the implicit block rolled back).
      inTransactionBlock = !beginAfter;
      let openingRows: Row[];
      if (opening === undefined) openingRows = await query('BEGIN');
      else if (beginAfter) {
        openingRows = await queryFirstRows(`${opening}; BEGIN`);
        inTransactionBlock = true;
      } else {
        // Pipelined: BEGIN and the opening statement in one simple-protocol query, one round trip.
        openingRows = await query(`BEGIN; ${opening}`);
      }
      // From here on, a ReadyForQuery that says idle means the task ended the transaction.
      following = followTransaction(lease.client);
      const ctx = new FateTransactionContext(query, lease.client, fate);
      if (interrupt) {
        ctx.interrupt = () => {
          interrupted = true;
          return interrupt();
        };
      }
      if (following) ctx.ended = following.ended;
      const rows = opening === undefined ? [] : openingRows;
      const result = await exclusively(() => fn(ctx, rows));
      following?.stop();
      if (await commit()) {
        inTransactionBlock = false;
        throw new CommitRolledBackError(
          "COMMIT answered ROLLBACK: a statement of the task's transaction had failed (perhaps one the task caught), so nothing was written. The lock is released.",
        );
      }
      return result;
    } catch (error) {
      if (!fate.aborted && inTransactionBlock) {
        try {
          await query('ROLLBACK');
        } catch (rollbackError) {
          broken = rollbackError as Error;
        }
      }
      throw error;
    } finally {
      following?.stop();
      unwatch();
      // A connection that was the target of a cancel never serves anyone else: the cancel may
      // still be on its way.
      if (interrupted && !broken && !lease.single) broken = new Error('interrupted by lockkit');
      lease.done(fate.aborted ? (fate.reason as Error) : broken);
    }
  }

  const executor: LockExecutor<PgClientLike, PgClientLike> = {
    name,
    transactionPooler: options.transactionPooler === true,
    singleConnection: onlyOne,
    commitReportsRollback: true,
    transaction: (fn) => inTransaction(undefined, (ctx) => fn(ctx)),
    pipelinedTransaction: (opening, fn, beforeSend) =>
      inTransaction(opening, fn, false, beforeSend),
    firstThenBegin: (first, fn, beforeSend) => inTransaction(first, fn, true, beforeSend),
    async session<T>(fn: (ctx: SessionContext<PgClientLike>) => Promise<T>): Promise<T> {
      const lease = await acquire();
      const { fate, query, unwatch } = watch(lease.client);
      const interrupt = onlyOne ? interrupter(lease.client) : undefined;
      let discarded: Error | undefined;
      try {
        // Cleaning the session afterwards would roll back the caller's own transaction.
        const dead = deadClientError(lease);
        if (dead) throw dead;
        if (callerTransactionOpen(lease)) throw callerTransactionError();
        const backendPid = lease.client.processID ?? undefined;
        const { client } = lease;
        return await exclusively(() =>
          fn({
            query,
            session: client,
            get signal() {
              return fate.signal;
            },
            backendPid,
            ...inTransactionFrom(client),
            ...(interrupt && {
              interrupt: () => {
                discarded ??= new Error('interrupted by lockkit');
                return interrupt();
              },
            }),
            discard: () => {
              discarded ??= new Error('discarded by lockkit: not known clean');
            },
          }),
        );
      } finally {
        unwatch();
        lease.done(fate.aborted ? (fate.reason as Error) : lease.single ? undefined : discarded);
      }
    },
  };
  return Object.freeze(executor);
}

function poolLeases(pool: PgPoolLike): () => Promise<Lease<PgPoolClientLike>> {
  return async () => {
    const client = await pool.connect();
    return { client, single: false, done: (broken) => client.release(broken ?? false) };
  };
}

/** One client, one operation at a time: a FIFO of waiters. */
function clientLeases(client: PgClientLike): () => Promise<Lease<PgClientLike>> {
  let tail: Promise<void> = Promise.resolve();
  return async () => {
    let free!: () => void;
    const turn = new Promise<void>((resolve) => {
      free = resolve;
    });
    const previous = tail;
    tail = previous.then(() => turn);
    await previous;
    return { client, single: true, done: () => free() };
  };
}
