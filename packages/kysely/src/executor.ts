/**
 * The Kysely executor: every lock in `db.transaction().execute(…)`, every session on a connection
 * pinned with `db.connection().execute(…)`, lockkit's statements sent as Kysely compiled queries
 * with their `$n` parameters. Only Kysely's public API is used, so it works on any Postgres
 * dialect; what Kysely does not show (the driver's connections, their events, the pool's size)
 * comes from the optional `pool` option.
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
  BACKEND_PID,
  BackendWatch,
  ConnectionFate,
  END_OWN_BACKEND,
  endOnLoss,
  FateTransactionContext,
  guardCheckouts,
  inTransactionFrom,
  isConnectionLoss,
  NestedCallGuard,
  type PgEventSourceLike,
  RESET_AUTHORIZATION,
  retryDeadStart,
  SESSION_RESET,
  sendCancelRequest,
  slotOf,
} from '@lockkit/core/adapter';
import { CompiledQuery, type Kysely, type Transaction } from 'kysely';
import { takePinned, underPinMark, watchConnects } from './pinned-client.js';

/** A connection of the `pg.Pool` under Kysely, as lockkit uses it. */
export interface KyselyPgClientLike extends PgEventSourceLike {
  /** BackendKeyData's pid and secret key, for the protocol's CancelRequest. */
  readonly processID?: number | null;
  readonly secretKey?: number | null;
  /** The server the connection reached (a host name, or a Unix socket directory). */
  readonly host?: string;
  readonly port?: number;
  /** Set by the pool at checkout: with `true`, the pool destroys the connection. */
  release?: (destroy?: boolean | Error) => void;
  /** The transaction status of the last ReadyForQuery: `'I'` idle, `'T'` open, `'E'` failed. */
  getTransactionStatus?(): string | null;
  /** node-postgres's query; lockkit watches its failures for a lost connection. */
  query?: (...args: unknown[]) => unknown;
  /** Closes the connection (node-postgres marks it ending at once). */
  end?: () => Promise<void>;
}

/**
 * The `pg.Pool` under Kysely's `PostgresDialect`, as lockkit uses it: its `'acquire'` and
 * `'connect'` events, and its `max` option.
 */
export interface KyselyPgPoolLike {
  connect(): Promise<KyselyPgClientLike>;
  on(event: 'acquire' | 'connect', listener: (client: KyselyPgClientLike) => void): unknown;
  readonly options?: { readonly max?: number | undefined };
}

/** Options of {@link kyselyExecutor}. */
export interface KyselyExecutorOptions {
  /** Name reported in errors; default `'kysely'`. */
  readonly name?: string;
  /**
   * Declare a transaction-pooling proxy (PgBouncer in transaction mode, Supavisor, RDS Proxy,
   * pgcat): session scope is then refused before any SQL. With the `pool` option lockkit also
   * detects PgBouncer on its own; without it, it cannot (Kysely does not report the backend pid
   * its driver was given at connect), so session scope is refused (`OPTION_INVALID`) unless you
   * declare `false` here: there is no pooler, on your word.
   */
  readonly transactionPooler?: boolean;
  /**
   * The `pg.Pool` given to `PostgresDialect`, when that is the dialect. node-postgres emits
   * `'error'` on a checked-out connection whose server went away, and with no listener that
   * crashes the process: with the pool, lockkit listens on every connection it hands out, learns
   * at once that a connection closed, and knows a pool of one (a lockkit call from inside a task
   * is then refused with `NESTED_CALL` instead of waiting forever). lockkit also wraps the pool's
   * `connect()` once, to see which connection Kysely pinned for a session: its startup pid
   * detects a transaction pooler, and it is closed after the task instead of reset.
   */
  readonly pool?: KyselyPgPoolLike;
  /**
   * How often, while tasks run, lockkit asks the server whether their connections still live
   * (Kysely reports no connection events). Default 1000 ms.
   */
  readonly livenessCheckMs?: number;
}

/** The statement a watched connection is probed with: it fails at once on a dead connection. */
const PROBE = 'SELECT 1';

/** Core's statement as a Kysely compiled query: text and parameters as they are. */
function compiled(text: string, params: readonly unknown[] | undefined): CompiledQuery<Row> {
  return CompiledQuery.raw(text, params === undefined ? [] : [...params]);
}

/**
 * Runs core's statements on one Kysely handle (a transaction, a pinned connection). The user's
 * plugins are left out: one that rewrites results (`CamelCasePlugin`) would rename the columns
 * core reads (`runner_gone` to `runnerGone`), and a renamed column reads as missing.
 */
function sender(handle: Kysely<never>, fate: ConnectionFate): QueryFn {
  const bare = handle.withoutPlugins();
  return async (text, params) => {
    if (fate.aborted) throw fate.reason;
    try {
      return [...(await bare.executeQuery(compiled(text, params))).rows];
    } catch (error) {
      if (isConnectionLoss(error)) fate.abort(error);
      throw error;
    }
  };
}

/**
 * The protocol's cancel of what `client` runs, for a pool of one (core has no second connection to
 * cancel from). The connection then goes back to the pool destroyed, never lent on: the cancel
 * may still be on its way. Undefined when the driver lacks BackendKeyData.
 */
function interrupter(client: KyselyPgClientLike | undefined): (() => Promise<void>) | undefined {
  const { processID, secretKey, host, port } = client ?? {};
  if (client === undefined || typeof processID !== 'number' || typeof secretKey !== 'number')
    return undefined;
  if (typeof host !== 'string' || typeof port !== 'number') return undefined;
  return () => {
    destroyOnRelease(client);
    return sendCancelRequest({ host, port, pid: processID, secretKey });
  };
}

/** How long a session call waits for its closed connection's server to hang up. */
const CLOSE_WAIT_MS = 2000;

/**
 * Resolves once `client`'s connection has ended: the server hangs up after its backend exited, and
 * with it every lock of the session is gone. Bounded, so that a silent network cannot hold the
 * call.
 */
function closedOf(client: KyselyPgClientLike): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, CLOSE_WAIT_MS);
    timer.unref();
    client.on('end', () => {
      clearTimeout(timer);
      resolve();
    });
  });
}

/**
 * Makes the pool close `client` when Kysely gives it back: pg-pool sets `release` at each checkout,
 * and Kysely calls it without an error when it is done.
 */
function destroyOnRelease(client: KyselyPgClientLike): void {
  const release = client.release;
  if (typeof release === 'function') client.release = () => release.call(client, true);
}

/**
 * A {@link LockExecutor} over a `Kysely<DB>` instance on a Postgres dialect.
 *
 * Capabilities: transaction and session. Tasks receive Kysely's own `Transaction<DB>` (transaction
 * scope) or the connection-bound `Kysely<DB>` (session scope). No one-round-trip capability:
 * Kysely's pg connection reads one result per query, so the rows of a multi-statement query are
 * lost.
 *
 * @example
 * ```ts
 * import { Kysely, PostgresDialect } from 'kysely';
 * import pg from 'pg';
 * import { createLockClient } from '@lockkit/core';
 * import { kyselyExecutor } from '@lockkit/kysely';
 * const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL });
 * const db = new Kysely<Database>({ dialect: new PostgresDialect({ pool }) });
 * const locks = createLockClient(kyselyExecutor(db, { pool }));
 * ```
 */
export function kyselyExecutor<DB>(
  db: Kysely<DB>,
  options: KyselyExecutorOptions = {},
): LockExecutor<Transaction<DB>, Kysely<DB>> {
  const name = options.name ?? 'kysely';
  // A Transaction (or ControlledTransaction) refuses transaction() and connection(): every call
  // would fail with Kysely's bare Error, and its statements would be the caller's transaction's.
  if ((db as { isTransaction?: unknown }).isTransaction === true) {
    throw new LockkitError(
      'OPTION_INVALID',
      `The ${name} executor needs the Kysely instance, but was given a Transaction of it (the trx of db.transaction().execute or db.startTransaction()): pass the Kysely instance itself; lockkit opens its own transactions on connections of its pool.`,
    );
  }
  // Without the user's plugins, for the reason given at `sender`.
  const untyped = (db as unknown as Kysely<never>).withoutPlugins();
  const watch = new BackendWatch(
    async (text, params) => (await untyped.executeQuery(compiled(text, params))).rows,
    { intervalMs: options.livenessCheckMs ?? 1000 },
  );
  const pool = options.pool;
  if (pool !== undefined) {
    guardCheckouts(pool);
    watchConnects(pool);
    // Some connection closed: ask at once which watched backends are gone.
    pool.on('connect', (client) => {
      client.on('end', () => void watch.check());
      endOnLoss(client);
    });
  }
  const singleConnection = pool?.options?.max === 1;
  // A pool of one lends one connection at a time: the last one it handed out is the task's.
  let lent: KyselyPgClientLike | undefined;
  if (pool !== undefined && singleConnection) {
    pool.on('acquire', (client) => {
      lent = client;
    });
  }
  const nested = new NestedCallGuard(name, singleConnection, pool ?? db);

  /**
   * Watches the backend of one transaction or session; the returned function stops. `probe`
   * sends a statement on the watched connection itself, for when every connection of the pool is
   * busy and the question through the pool waits.
   */
  const watched = (pid: unknown, fate: ConnectionFate, probe?: () => Promise<unknown>) =>
    watch.add({ pid: Number(pid), fate, ...(probe && { probe }) });

  /** One transaction on a connection Kysely takes from its pool. */
  function begin<T>(fn: (ctx: TransactionContext<Transaction<DB>>) => Promise<T>): Promise<T> {
    nested.check();
    const fate = new ConnectionFate();
    let running: Promise<unknown> | undefined;
    let unwatch: (() => void) | undefined;
    // With the pool, the transaction's connection is known (the pool's connect() reports it under
    // lockkit's mark): its close aborts the transaction at once. Asking the server could not: it
    // needs a free connection of the pool, and all of them may be busy (the app's own queries,
    // other tasks; on a pool of one, the dead transaction's own).
    let slot: ReturnType<typeof slotOf> | undefined;
    const open = () =>
      db.transaction().execute(async (trx) => {
        const client = pool === undefined ? undefined : takePinned<KyselyPgClientLike>();
        if (client !== undefined) {
          slot = slotOf(client);
          slot.current = fate;
          if (slot.lost !== undefined) fate.abort(slot.lost);
        }
        const send = sender(trx as unknown as Kysely<never>, fate);
        // Probes only while the task runs: one sent later could reach the connection after COMMIT.
        let taskRunning = true;
        const probe = () => (taskRunning ? send(PROBE) : Promise.resolve());
        // The backend to watch (as well, with the connection known: a transaction pooler may
        // keep the link open while the server's backend is gone): core's opening statements
        // report it (they start with BACKEND_PID), which saves a round trip; after any other
        // first statement, ask.
        const query: QueryFn = async (text, params) => {
          const rows = await send(text, params);
          if (unwatch === undefined) {
            const reported = text.startsWith(BACKEND_PID) ? rows : await send(BACKEND_PID);
            // No probe with the connection known: its events need no free connection, and a
            // probe would count as activity against idleInTransactionTimeoutMs.
            unwatch = watched(reported[0]?.pid, fate, slot === undefined ? probe : undefined);
          }
          return rows;
        };
        const ctx = new FateTransactionContext(query, trx, fate);
        const interrupt = singleConnection ? interrupter(client ?? lent) : undefined;
        if (interrupt) ctx.interrupt = interrupt;
        const task = nested.run(() => fn(ctx));
        running = task;
        return task.finally(() => {
          taskRunning = false;
        });
      });
    return (pool === undefined ? open() : underPinMark(open))
      .catch(async (error: unknown) => {
        if (isConnectionLoss(error)) fate.abort(error);
        // Kysely rejects once its COMMIT or ROLLBACK failed: let the task finish first.
        if (running) await running.catch(() => {});
        throw error;
      })
      .finally(() => {
        unwatch?.();
        if (slot?.current === fate) slot.current = undefined;
      });
  }

  const executor: LockExecutor<Transaction<DB>, Kysely<DB>> = {
    name,
    transactionPooler: options.transactionPooler === true,
    singleConnection,
    // A connection whose backend was terminated a moment ago is lent as live until pg reads the
    // goodbye, and Kysely's BEGIN fails on it; the pool discards it (ended by endOnLoss, or no
    // longer queryable), and the call begins again on another.
    transaction: (fn) => retryDeadStart(begin, fn),
    session<T>(fn: (ctx: SessionContext<Kysely<DB>>) => Promise<T>): Promise<T> {
      nested.check();
      if (pool === undefined && options.transactionPooler !== false) {
        // Without the pool lockkit cannot see the startup pid that gives a transaction pooler
        // away, and behind one the tasks of one session lock would run side by side.
        return Promise.reject(
          new LockkitError(
            'OPTION_INVALID',
            `The ${name} executor cannot tell a transaction pooler (PgBouncer in transaction mode) from a server without the pool option: give it the pg.Pool your PostgresDialect uses, or declare transactionPooler: false to take session locks on your word.`,
          ),
        );
      }
      // Set when the session's connection is to be closed: resolves once it has.
      let closed: Promise<void> | undefined;
      const pinned = () =>
        db.connection().execute(async (connection) => {
          // The pg connection under it, when lockkit has the pool: its startup pid, its
          // transaction status, and the one connection to close afterwards.
          const client = pool === undefined ? undefined : takePinned<KyselyPgClientLike>();
          if (pool !== undefined && client === undefined) {
            // Kysely took the connection from another pool: lockkit sees neither its startup pid
            // (a transaction pooler would go undetected) nor the connection to close afterwards.
            throw new LockkitError(
              'OPTION_INVALID',
              `The ${name} executor's pool option is not the pg.Pool Kysely's PostgresDialect draws from: give lockkit that very pool (or none, and declare transactionPooler).`,
            );
          }
          const fate = new ConnectionFate();
          const slot = client === undefined ? undefined : slotOf(client);
          if (slot) slot.current = fate;
          const query = sender(connection as unknown as Kysely<never>, fate);
          let unwatch: (() => void) | undefined;
          // Alone in its pool, a wait can only be cancelled with the protocol's own request; with
          // more connections core cancels from another one.
          const interrupt = singleConnection ? interrupter(client ?? lent) : undefined;
          let discarded = false;
          // Probes only while the task runs: one sent later could reach the connection after
          // Kysely gave it back.
          let taskRunning = true;
          const probe = () => (taskRunning ? query(PROBE) : Promise.resolve());
          try {
            if (slot === undefined) {
              const [row] = await query(BACKEND_PID);
              unwatch = watched(row?.pid, fate, probe);
            }
            return await nested.run(() =>
              fn({
                query,
                session: connection,
                get signal() {
                  return fate.signal;
                },
                backendPid: client?.processID ?? undefined,
                ...inTransactionFrom(client),
                discard: () => {
                  discarded = true;
                },
                ...(interrupt && { interrupt }),
              }),
            );
          } finally {
            taskRunning = false;
            unwatch?.();
            if (slot?.current === fate) slot.current = undefined;
            // Without the pool lockkit cannot end a dead connection, and Kysely gives it back as
            // soon as the task settles: after a backend's FATAL, before node-postgres has read
            // the hang-up, so the pool would lend it on. It goes back once the driver knows.
            if (fate.aborted && client === undefined) await hangUpSeen(connection);
            if (discarded && !fate.aborted) {
              if (client) {
                closed = closedOf(client);
                destroyOnRelease(client);
              } else await resetOrEnd(query);
            }
          }
        });
      const opened = pool === undefined ? pinned() : underPinMark(pinned);
      // Postgres frees a closed session's locks as its backend exits: the call returns after that,
      // so no caller finds the session's locks still held once it has.
      return opened.finally(() => closed);
    },
  };
  return Object.freeze(executor);
}

/**
 * Resolves once the driver under `connection` has seen it close, so that its pool discards it: a
 * statement sent on a connection whose server said goodbye fails only when the driver reads the
 * hang-up (node-postgres then marks the connection unusable). Bounded like {@link closedOf}: a
 * silent network cannot hold the call.
 */
async function hangUpSeen(connection: unknown): Promise<void> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const probe = (connection as Kysely<never>)
    .withoutPlugins()
    .executeQuery(CompiledQuery.raw('SELECT 1'))
    .then(
      () => {},
      () => {},
    );
  await Promise.race([
    probe,
    new Promise<void>((resolve) => {
      timer = setTimeout(resolve, CLOSE_WAIT_MS);
      timer.unref();
    }),
  ]);
  clearTimeout(timer);
}

/**
 * Makes a session connection safe to lend on: Kysely cannot close one pooled connection, so it is
 * reset in full (settings, role, locks, LISTEN, temporary objects…). Only a connection the reset
 * fails on is ended, back to the authenticated user first so that the task's role cannot forbid
 * it; its pool then drops it.
 */
async function resetOrEnd(query: QueryFn): Promise<void> {
  const ignore = () => [];
  const reset = await query(SESSION_RESET).then(
    () => true,
    () => false,
  );
  if (reset) return;
  for (const statement of RESET_AUTHORIZATION) await query(statement).catch(ignore);
  await query(END_OWN_BACKEND).catch(ignore);
}
