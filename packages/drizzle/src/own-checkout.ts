/**
 * Drizzle transactions on a pool connection that lockkit checks out and gives back itself.
 *
 * Drizzle's pooled sessions (node-postgres, and the drivers built the same way) check a client out
 * and then send BEGIN *before* the `try` whose `finally` releases it (drizzle-orm 0.45,
 * `node-postgres/session.js`). A BEGIN that fails — the link lost, the backend terminated — so
 * never gives the client back, and a pool of one is wedged for ever. Here lockkit checks the
 * client out, runs Drizzle's own `transaction()` on a copy of the database's session bound to that
 * client (so the task still gets Drizzle's transaction object, savepoints and all), and releases
 * the client in its own `finally` — destroying it when its connection broke.
 *
 * @packageDocumentation
 */
import { isConnectionLoss, type PgEventSourceLike, slotOf } from '@lockkit/core/adapter';

/** The part of a pooled client (a `pg.PoolClient`) used here. */
interface PooledClientLike extends PgEventSourceLike {
  /** With an error (or `true`), the pool destroys the connection instead of reusing it. */
  release(error?: Error | boolean): void;
}

/** The part of a pool (a `pg.Pool`) used here. */
interface PoolLike {
  connect(): Promise<PooledClientLike>;
}

/** The part of a Drizzle session used here: the driver client it sends through, and `transaction`. */
interface DrizzleSessionLike<Tx> {
  client: unknown;
  transaction<T>(fn: (tx: Tx) => Promise<T>): Promise<T>;
}

/** How a transaction went, for the release: whether the connection must be destroyed. */
export interface CheckoutOutcome {
  /** Set by the caller when a protocol cancel was sent on the connection (it may still arrive). */
  interrupted: boolean;
}

/** Runs Drizzle's `transaction()` on a client lockkit checked out itself. */
export type OwnCheckoutTransaction<Tx> = <T>(
  fn: (tx: Tx, outcome: CheckoutOutcome) => Promise<T>,
) => Promise<T>;

function isSessionOf<Tx>(session: unknown, pool: object): session is DrizzleSessionLike<Tx> {
  return (
    typeof session === 'object' &&
    session !== null &&
    (session as { client?: unknown }).client === pool &&
    typeof (session as { transaction?: unknown }).transaction === 'function'
  );
}

/**
 * Drizzle's `transaction()` on a connection lockkit checks out of `pool` and always releases,
 * for a database whose session sends through that pool; undefined for any other shape (the caller
 * then uses `db.transaction` as it is).
 *
 * The connection is destroyed rather than reused when it was lost (an error that means so, or its
 * `'error'`/`'end'` event) or when `outcome.interrupted` says a cancel was sent on it.
 */
export function ownCheckoutTransaction<Tx>(
  db: { readonly session?: unknown },
  pool: unknown,
): OwnCheckoutTransaction<Tx> | undefined {
  if (typeof pool !== 'object' || pool === null) return undefined;
  if (typeof (pool as { connect?: unknown }).connect !== 'function') return undefined;
  const session = db.session;
  if (!isSessionOf<Tx>(session, pool)) return undefined;
  return async (fn) => {
    const client = await (pool as PoolLike).connect();
    // Listening from checkout on: a server lost under BEGIN is an event no one else hears.
    const slot = slotOf(client);
    // The database's own session (dialect, schema, logger, cache), sending through this client:
    // given a client instead of a pool, Drizzle neither checks out nor releases.
    const bound: DrizzleSessionLike<Tx> = Object.assign(
      Object.create(Object.getPrototypeOf(session) as object) as DrizzleSessionLike<Tx>,
      session,
      { client },
    );
    const outcome: CheckoutOutcome = { interrupted: false };
    let broken: Error | undefined;
    try {
      return await bound.transaction((tx) => fn(tx, outcome));
    } catch (error) {
      if (isConnectionLoss(error)) broken = error as Error;
      throw error;
    } finally {
      const lost = slot.lost !== undefined ? (slot.lost as Error) : undefined;
      client.release(broken ?? lost ?? outcome.interrupted);
    }
  };
}
