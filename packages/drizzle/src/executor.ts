/**
 * The Drizzle executor: transactions through `db.transaction(…)` on any Drizzle Postgres
 * database, with lockkit's statements bound as Drizzle parameters. Session scope is composed by
 * the user: Drizzle cannot pin a connection, so the executor of the driver under it lends them
 * (`sessions: pgExecutor(pool)` from `@lockkit/pg`, `postgresExecutor(sql)` from
 * `@lockkit/postgres`); this package imports neither.
 */
import {
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
  guardCheckouts,
  isConnectionLoss,
  NestedCallGuard,
  type PgEventSourceLike,
  type PgPoolEventsLike,
  retryDeadStart,
  type ShieldSqlLike,
  type StaleFatalShield,
  sendCancelRequest,
  slotOf,
  staleFatalShield,
} from '@lockkit/core/adapter';
import { type SQL, sql } from 'drizzle-orm';
import { type OwnCheckoutTransaction, ownCheckoutTransaction } from './own-checkout.js';

/** What lockkit needs of a Drizzle transaction: `execute`, and (at runtime) its session. */
export interface DrizzleTransactionLike {
  execute(query: SQL): Promise<unknown>;
}

/** What lockkit needs of a Drizzle Postgres database. */
export interface DrizzleDatabaseLike<Tx extends DrizzleTransactionLike> {
  transaction<T>(fn: (tx: Tx) => Promise<T>): Promise<T>;
  /** The driver client Drizzle was made with (Drizzle ≥ 0.36). */
  readonly $client?: unknown;
}

/**
 * What lends dedicated connections for session scope: any executor with the session capability,
 * over the same database as Drizzle — `pgExecutor(pool)` (`@lockkit/pg`) for node-postgres,
 * `postgresExecutor(sql)` (`@lockkit/postgres`) for postgres.js.
 */
export type DrizzleSessions<Session> = Pick<LockExecutor<unknown, Session>, 'session'>;

/** Options of {@link drizzleExecutor}. */
export interface DrizzleExecutorOptions<Session = never> {
  /** Name reported in errors; default `'drizzle'`. */
  readonly name?: string;
  /** Declare a transaction-pooling proxy: session scope is refused before any SQL. */
  readonly transactionPooler?: boolean;
  /**
   * Session scope, lent by the executor of the driver under Drizzle. Without it the executor has
   * no session capability: session calls fail at once with `UnsupportedCapabilityError`.
   */
  readonly sessions?: DrizzleSessions<Session> | undefined;
}

/**
 * Core's `$1 … $n` statement as Drizzle SQL: the text between placeholders raw, each placeholder a
 * bound parameter. Core's texts contain no `$n` inside string literals.
 */
export function toDrizzleSql(text: string, params: readonly unknown[] = []): SQL {
  const parts = text.split(/\$(\d+)/);
  const chunks: SQL[] = [];
  for (let i = 0; i < parts.length; i++) {
    if (i % 2 === 0) {
      if (parts[i]) chunks.push(sql.raw(parts[i] as string));
    } else {
      chunks.push(sql`${params[Number(parts[i]) - 1]}`);
    }
  }
  return sql.join(chunks);
}

/** Rows from any Drizzle driver's `execute` result: an array (postgres.js) or `{ rows }`. */
function rowsOf(result: unknown): Row[] {
  if (Array.isArray(result)) return result as Row[];
  const rows = (result as { rows?: unknown } | null)?.rows;
  return Array.isArray(rows) ? (rows as Row[]) : [];
}

/** A pg-style client, whose 'error'/'end' events tell that the connection died. */
function isEventful(value: unknown): value is PgEventSourceLike {
  return (
    typeof value === 'object' &&
    value !== null &&
    typeof (value as { on?: unknown }).on === 'function'
  );
}

/** The protocol cancel of what a node-postgres client runs; a no-op without its BackendKeyData. */
function protocolCancel(client: unknown): () => Promise<void> {
  return async () => {
    const { host, port, processID, secretKey } = (client ?? {}) as {
      host?: unknown;
      port?: unknown;
      processID?: unknown;
      secretKey?: unknown;
    };
    if (
      typeof host !== 'string' ||
      typeof port !== 'number' ||
      typeof processID !== 'number' ||
      typeof secretKey !== 'number'
    )
      return;
    await sendCancelRequest({ host, port, pid: processID, secretKey });
  };
}

/** postgres.js query options, with `onexecute` also handing the connection to `adopt`. */
function adopting(options: unknown, adopt: (connection: unknown) => unknown): object {
  const given =
    typeof options === 'object' && options !== null
      ? (options as { onexecute?: unknown })
      : undefined;
  const own = given?.onexecute;
  return {
    ...given,
    onexecute: (connection: unknown): unknown => {
      adopt(connection);
      // What postgres.js reads from `onexecute`: whether the connection may take more queries.
      return typeof own === 'function' ? (own as (c: unknown) => unknown)(connection) : true;
    },
  };
}

/**
 * Makes the postgres.js connection under a Drizzle transaction refuse queries once its fate says
 * it died: postgres.js sends a query given a closed connection anyway, and crashes the process (a
 * TypeError thrown from a timer) or never answers. Drizzle's session reads `client` for every
 * query, so a guarded client there guards `tx.execute`, the query builders and savepoints.
 *
 * Every statement sent through it also shows its connection to the pool's stale-FATAL `shield`
 * (see `staleFatalShield` in `@lockkit/core/adapter`): should that backend be terminated, its
 * reconnect absorbs the FATAL postgres.js keeps, which would otherwise fail whichever query of
 * the application's, or of lockkit's, next drew the slot.
 */
function refuseWhenLost(tx: unknown, fate: ConnectionFate, shield: StaleFatalShield): void {
  const session = (tx as { session?: { client?: unknown } }).session;
  const client = session?.client;
  if (session === undefined || typeof client !== 'function') return;
  const refuse = () => {
    if (fate.aborted) throw fate.reason;
  };
  session.client = new Proxy(client, {
    apply: (target, thisArg, args) => {
      refuse();
      return Reflect.apply(target as (...a: unknown[]) => unknown, thisArg, args);
    },
    get: (target, property, receiver) => {
      const value = Reflect.get(target, property, receiver) as unknown;
      if (typeof value !== 'function' || property === 'constructor') return value;
      if (property !== 'unsafe' && property !== 'file' && property !== 'savepoint') return value;
      return (...args: unknown[]) => {
        refuse();
        if (property === 'unsafe') {
          // postgres.js also takes `unsafe(text, options)`: options in place of the parameters.
          const [text, second, third] = args;
          const [parameters, options] =
            args.length === 2 && !Array.isArray(second) ? [[], second] : [second ?? [], third];
          return (value as (...a: unknown[]) => unknown).call(
            target,
            text,
            parameters,
            adopting(options, shield.capture.onexecute),
          );
        }
        return (value as (...a: unknown[]) => unknown).apply(target, args);
      };
    },
  });
}

function kindOf(client: unknown): 'pg-pool' | 'pg-client' | 'postgres-js' | 'other' {
  if (
    typeof client === 'function' &&
    typeof (client as { reserve?: unknown }).reserve === 'function'
  ) {
    return 'postgres-js';
  }
  if (typeof client === 'object' && client !== null) {
    const c = client as { connect?: unknown; totalCount?: unknown; release?: unknown };
    if (typeof c.connect === 'function' && typeof c.totalCount === 'number') return 'pg-pool';
    if (typeof c.connect === 'function' && c.release === undefined) return 'pg-client';
  }
  return 'other';
}

/**
 * A {@link LockExecutor} over a Drizzle Postgres database (`drizzle-orm/node-postgres`,
 * `drizzle-orm/postgres-js`, or any other Postgres driver Drizzle supports).
 *
 * Capabilities: transaction (always); session where the driver under Drizzle can pin a connection
 * (a node-postgres pool, postgres.js). Tasks receive Drizzle's `tx`; nested `tx.transaction()`
 * calls are savepoints.
 *
 * @example
 * ```ts
 * import { drizzle } from 'drizzle-orm/node-postgres';
 * import { createLockClient } from '@lockkit/core';
 * import { drizzleExecutor } from '@lockkit/drizzle';
 * const locks = createLockClient(drizzleExecutor(drizzle(process.env.DATABASE_URL!)));
 * ```
 */
export function drizzleExecutor<Tx extends DrizzleTransactionLike, Session = never>(
  db: DrizzleDatabaseLike<Tx>,
  options: DrizzleExecutorOptions<Session> = {},
): LockExecutor<Tx, Session> {
  const name = options.name ?? 'drizzle';
  // A Drizzle transaction (PgTransaction: rollback() and its nesting depth) runs transaction() as a
  // savepoint of the caller's transaction: lockkit's transaction-scoped lock would outlive the call
  // until the caller's transaction ended, and its work would commit or roll back with the caller's.
  const maybeTx = db as { rollback?: unknown; nestedIndex?: unknown };
  if (typeof maybeTx.rollback === 'function' && typeof maybeTx.nestedIndex === 'number') {
    throw new LockkitError(
      'OPTION_INVALID',
      `The ${name} executor needs the Drizzle database, but was given a transaction of it (the tx of db.transaction()): pass the database itself; lockkit opens its own transactions.`,
    );
  }
  const transactionPooler = options.transactionPooler === true;
  const kind = kindOf(db.$client);
  // postgres.js hands a terminated backend's FATAL to the next request its slot reconnects for.
  const shield =
    kind === 'postgres-js' ? staleFatalShield(db.$client as unknown as ShieldSqlLike) : undefined;
  // On a pool, lockkit checks the connection out itself and always gives it back: Drizzle sends
  // BEGIN outside the try/finally that releases its own checkout (see own-checkout.ts).
  const ownCheckout =
    kind === 'pg-pool'
      ? ownCheckoutTransaction<Tx>(db as { readonly session?: unknown }, db.$client)
      : undefined;
  const drizzleTransaction: OwnCheckoutTransaction<Tx> =
    ownCheckout ?? ((fn) => db.transaction((tx) => fn(tx, { interrupted: false })));
  // A pool of another shape, where Drizzle checks connections out and sends BEGIN and COMMIT
  // itself, outside lockkit's callback: a server lost just then must not be an unhandled 'error'
  // event that crashes the process.
  if (kind === 'pg-pool' && ownCheckout === undefined && isEventful(db.$client)) {
    guardCheckouts(db.$client as unknown as PgPoolEventsLike);
  }
  if (kind === 'pg-client' && isEventful(db.$client)) slotOf(db.$client);
  // One pg.Client under Drizzle: operations must take turns on it.
  let tail: Promise<void> = Promise.resolve();
  const turn = async <T>(fn: () => Promise<T>): Promise<T> => {
    if (kind !== 'pg-client') return fn();
    const previous = tail;
    let done!: () => void;
    tail = new Promise<void>((resolve) => {
      done = resolve;
    });
    await previous;
    try {
      return await fn();
    } finally {
      done();
    }
  };

  // A node-postgres pool of one (or one client): a wait can only be cancelled with the protocol's
  // own request; with more connections core cancels from another one.
  const alone =
    kind === 'pg-client' ||
    (kind === 'pg-pool' && (db.$client as { options?: { max?: unknown } }).options?.max === 1);

  // One connection only (one pg.Client, a pool of one): a lockkit call from inside a task could
  // never get it.
  const singleConnection =
    alone ||
    (kind === 'postgres-js' && (db.$client as { options?: { max?: unknown } }).options?.max === 1);
  const nested = new NestedCallGuard(
    name,
    singleConnection,
    (typeof db.$client === 'object' && db.$client !== null) || typeof db.$client === 'function'
      ? (db.$client as object)
      : undefined,
  );

  const transaction = <T>(fn: (ctx: TransactionContext<Tx>) => Promise<T>): Promise<T> => {
    nested.check();
    return turn(async () => {
      // One pg.Client the caller left inside a transaction of its own: Drizzle's BEGIN would
      // only warn, and lockkit's COMMIT would commit the caller's work.
      if (kind === 'pg-client') {
        const status = (
          db.$client as { getTransactionStatus?: () => string | null }
        ).getTransactionStatus?.();
        if (status === 'T' || status === 'E') {
          throw new LockkitError(
            'CALLER_TRANSACTION_OPEN',
            `The ${name} executor's pg.Client is inside a transaction of the caller's own: lockkit's COMMIT would commit the caller's work (and its ROLLBACK undo it). Run lockkit on a pool, or outside your transaction.`,
          );
        }
      }
      // postgres.js: until the shield knows the pool's queues, a connection the pool opens fetches
      // its array types, whose failure postgres.js leaves unhandled (the process ends).
      const learning = shield?.ready();
      if (learning !== undefined) await learning;
      const fate = new ConnectionFate();
      let running: Promise<T> | undefined;
      try {
        return await drizzleTransaction(async (tx, checkout) => {
          // node-postgres: the transaction's PoolClient. Its slot's listeners (on since checkout,
          // see own-checkout.ts) report a backend death to this transaction while it runs.
          const client = (tx as unknown as { session?: { client?: unknown } }).session?.client;
          const slot = kind !== 'postgres-js' && isEventful(client) ? slotOf(client) : undefined;
          if (slot) slot.current = fate;
          if (shield !== undefined) refuseWhenLost(tx, fate, shield);
          const query: QueryFn = async (text, params) => {
            if (fate.aborted) throw fate.reason;
            try {
              return rowsOf(await tx.execute(toDrizzleSql(text, params)));
            } catch (error) {
              if (isConnectionLoss(error)) fate.abort(error);
              throw error;
            }
          };
          let outcome: { ok: true; value: T } | { ok: false; error: unknown };
          try {
            const ctx = new FateTransactionContext(query, tx, fate);
            if (alone) {
              const cancel = protocolCancel(client);
              ctx.interrupt = () => {
                // The cancel may still be on its way: the connection must serve no one else.
                checkout.interrupted = true;
                return cancel();
              };
            }
            running = nested.run(() => fn(ctx));
            outcome = { ok: true, value: await running };
          } catch (error) {
            outcome = { ok: false, error };
          } finally {
            if (slot?.current === fate) slot.current = undefined;
          }
          if (fate.aborted && kind === 'postgres-js') {
            // postgres.js has already rejected this transaction; settling the callback now would
            // make it send COMMIT or ROLLBACK on the closed connection, which crashes the process.
            await new Promise<never>(() => {});
          }
          if (!outcome.ok) throw outcome.error;
          return outcome.value;
        });
      } catch (error) {
        // postgres.js rejects its transaction as soon as the connection closes, while the task
        // may still be running: tell the task, and let it finish before reporting.
        if (isConnectionLoss(error)) fate.abort(error);
        if (running) await running.catch(() => {});
        throw error;
      }
    });
  };

  const base: LockExecutor<Tx, Session> = {
    name,
    transactionPooler,
    singleConnection,
    // A pooled connection whose backend was terminated a moment ago is lent as live until the
    // driver reads the goodbye, and Drizzle's BEGIN (all it sends before the callback) fails on
    // it: the call begins again on another connection (node-postgres: the checkout above
    // destroys the dead one; postgres.js: its closed slot reconnects, and a FATAL it kept from
    // a dead connection the shield had not seen fails that BEGIN instead of a later caller's).
    // Not on one pg.Client:
    // there is no other connection to begin on.
    transaction: kind === 'pg-client' ? transaction : (fn) => retryDeadStart(transaction, fn),
  };
  const sessions = options.sessions;
  if (sessions === undefined) return Object.freeze(base);
  const lend = sessions.session;
  if (typeof lend !== 'function') {
    throw new LockkitError(
      'OPTION_INVALID',
      'sessions must be an executor with the session capability (pgExecutor(pool), postgresExecutor(sql)).',
    );
  }
  return Object.freeze({
    ...base,
    session: <T>(fn: (ctx: SessionContext<Session>) => Promise<T>): Promise<T> =>
      lend.call(sessions, fn) as Promise<T>,
  });
}
