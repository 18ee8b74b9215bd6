/**
 * How a connection lockkit will not lend on leaves Knex's pool: closed, and no longer counted.
 *
 * Knex's own way to drop a connection is to mark it (`__knex__disposed`) and give it back: its pool
 * (tarn) keeps it as free until someone next asks for a connection, then validates it, and Knex's
 * validator logs `Connection Error: …` as a warning before the pool destroys it. For Knex that is
 * right, because Knex drops a connection only when something went wrong. lockkit drops one after
 * every session lock, as a matter of course (nothing the task did to its session may reach the next
 * borrower), and a warning per call would be noise in every user's log. Until that next borrower,
 * the dead connection would also be counted free, and a live one would keep its session locks.
 *
 * Tarn has no public call that destroys one lent resource. It does what is needed when a free
 * resource fails validation: take it out of `used` and settle it (a `destroy()` of the pool waits
 * for that), destroy it through the pool's own destroyer (Knex's `destroyRawConnection`, which ends
 * the connection), then let waiting borrowers go on.
 * Those members are `protected` in tarn's typings (there for subclasses, as Knex's `KnexPool` is
 * one); this file does the same steps, and only when the pool has what they use, so that a pool
 * of another shape (an application's `pg.Pool` given as `connectionPool`) takes the marked path.
 *
 * @packageDocumentation
 */
import type { Knex } from 'knex';

/** The members of a tarn pool that taking one lent resource out uses. */
interface TarnPoolInternals {
  /** Lent resources; `settle()` tells a waiting `destroy()` of the pool that one came back. */
  used: { readonly resource: unknown; settle(): void }[];
  _destroy(resource: unknown): Promise<unknown>;
  _tryAcquireOrCreate(): void;
}

/** Where Knex's pg dialect and pool mark a connection not to be handed out again. */
interface Disposable {
  __knex__disposed?: unknown;
  end?: () => Promise<void>;
}

function tarnInternals(pool: unknown): TarnPoolInternals | undefined {
  if (typeof pool !== 'object' || pool === null) return undefined;
  const candidate = pool as Partial<TarnPoolInternals>;
  return Array.isArray(candidate.used) &&
    candidate.used.every((entry) => typeof entry?.settle === 'function') &&
    typeof candidate._destroy === 'function' &&
    typeof candidate._tryAcquireOrCreate === 'function'
    ? (candidate as TarnPoolInternals)
    : undefined;
}

/**
 * Takes `connection`, lent by `client`'s pool, out of that pool for good, and resolves once it is
 * closed (its session, and any session lock in it, gone from the server). `reason` is why, kept
 * as Knex's mark for a pool that still sees the connection.
 */
export async function discardFromPool(
  client: Knex.Client,
  connection: object,
  reason: unknown,
): Promise<void> {
  const disposable = connection as Disposable;
  disposable.__knex__disposed ??= reason;
  const tarn = tarnInternals((client as { pool?: unknown }).pool);
  const lent = tarn?.used.findIndex((entry) => entry.resource === connection) ?? -1;
  if (tarn && lent >= 0) {
    const [entry] = tarn.used.splice(lent, 1);
    // A pool.destroy() under way waits for each lent resource to settle.
    entry?.settle();
    // Tarn's destroy never rejects: a destroyer's failure goes to the pool's own log and events.
    await tarn._destroy(connection);
    tarn._tryAcquireOrCreate();
    return;
  }
  // Another pool: close the connection now, then give it back marked; Knex's wrapper of a
  // node-postgres pool then asks that pool to remove it.
  await disposable.end?.().catch(() => {});
  await client.releaseConnection(connection);
}
