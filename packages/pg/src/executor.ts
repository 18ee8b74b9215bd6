/**
 * The node-postgres executor: transactions and sessions on connections from a `pg.Pool`, or on
 * one `pg.Client` used by one operation at a time.
 *
 * The driver types are declared structurally (what we call, nothing more), so this package does
 * not depend on `@types/pg` and accepts any compatible pool.
 */
import {
  ConnectionFate,
  type LockExecutor,
  type QueryFn,
  type Row,
  type SessionContext,
  type TransactionContext,
} from '@lockkit/core';
import { slotOf } from './connection-slots.js';

/** The part of a `pg` query result we read. */
export interface PgResultLike {
  readonly rows: Row[];
}

/** The part of a `pg.Client` / `pg.PoolClient` we use. */
export interface PgClientLike {
  /** The backend pid from the server's BackendKeyData at connect (pg sets it on the client). */
  readonly processID?: number | null;
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

/** True for errors that mean the connection itself is unusable, not that one statement failed. */
function isConnectionError(error: unknown): boolean {
  if (typeof error !== 'object' || error === null) return false;
  const { code, message } = error as { code?: unknown; message?: unknown };
  if (typeof code === 'string' && /^(57P0[123]|08\w{3})$/.test(code)) return true;
  if (typeof code === 'string' && /^E[A-Z]+$/.test(code)) return true; // ECONNRESET, EPIPE, …
  return (
    typeof message === 'string' &&
    /Connection terminated|not queryable|connection error|Client was closed/i.test(message)
  );
}

interface Lease<C extends PgClientLike> {
  readonly client: C;
  readonly done: (broken: Error | undefined) => void;
}

/** Watches one checked-out connection: its fate turns aborted when the connection errors or ends. */
function watch(client: PgClientLike): {
  fate: ConnectionFate;
  query: QueryFn;
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
      if (isConnectionError(error)) fate.abort(error);
      throw error;
    }
  };
  const query: QueryFn = (text, params) => run(text, params, 'last');
  return {
    fate,
    query,
    queryFirstRows: (text) => run(text, undefined, 'first'),
    unwatch: () => {
      if (slot.current === fate) slot.current = undefined;
    },
  };
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
  const acquire = isPool(handle) ? poolLeases(handle) : clientLeases(handle as PgClientLike);

  async function inTransaction<T>(
    opening: string | undefined,
    fn: (ctx: TransactionContext<PgClientLike>, openingRows: Row[]) => Promise<T>,
    beginAfter = false,
  ): Promise<T> {
    const lease = await acquire();
    const { fate, query, queryFirstRows, unwatch } = watch(lease.client);
    let broken: Error | undefined;
    // `opening; BEGIN` that fails leaves no transaction behind (the implicit block rolled back).
    let inTransactionBlock = !beginAfter;
    try {
      let openingRows: Row[];
      if (opening === undefined) openingRows = await query('BEGIN');
      else if (beginAfter) {
        openingRows = await queryFirstRows(`${opening}; BEGIN`);
        inTransactionBlock = true;
      } else {
        // Pipelined: BEGIN and the opening statement in one simple-protocol query, one round trip.
        openingRows = await query(`BEGIN; ${opening}`);
      }
      const result = await fn(
        {
          query,
          tx: lease.client,
          get signal() {
            return fate.signal;
          },
        },
        opening === undefined ? [] : openingRows,
      );
      await query('COMMIT');
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
      unwatch();
      lease.done(fate.aborted ? (fate.reason as Error) : broken);
    }
  }

  const executor: LockExecutor<PgClientLike, PgClientLike> = {
    name: options.name ?? 'pg',
    transactionPooler: options.transactionPooler === true,
    transaction: (fn) => inTransaction(undefined, (ctx) => fn(ctx)),
    pipelinedTransaction: (opening, fn) => inTransaction(opening, fn),
    firstThenBegin: (first, fn) => inTransaction(first, fn, true),
    async session<T>(fn: (ctx: SessionContext<PgClientLike>) => Promise<T>): Promise<T> {
      const lease = await acquire();
      const { fate, query, unwatch } = watch(lease.client);
      try {
        const backendPid = lease.client.processID ?? undefined;
        return await fn({
          query,
          session: lease.client,
          get signal() {
            return fate.signal;
          },
          backendPid,
        });
      } finally {
        unwatch();
        lease.done(fate.aborted ? (fate.reason as Error) : undefined);
      }
    },
  };
  return Object.freeze(executor);
}

function poolLeases(pool: PgPoolLike): () => Promise<Lease<PgPoolClientLike>> {
  return async () => {
    const client = await pool.connect();
    return { client, done: (broken) => client.release(broken ?? false) };
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
    return { client, done: () => free() };
  };
}
