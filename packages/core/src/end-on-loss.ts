/**
 * Ending a node-postgres connection the moment one of its queries fails with a lost connection.
 *
 * The server's FATAL (a terminated backend) reaches the running query before the socket's close
 * does, and until the close is read the client still looks queryable. A driver or ORM that gives
 * the connection back at once (Kysely after a failed BEGIN, TypeORM after a failed COMMIT) would
 * have the pool keep it and lend it, dead, to the next caller. `end()` marks it ending at once, and
 * node-postgres's pool discards a connection marked so when it comes back.
 *
 * @packageDocumentation
 */
import { isConnectionLoss } from './connection-loss.js';

/** What {@link endOnLoss} needs of a node-postgres connection. */
export interface LossEndableClientLike {
  /** node-postgres's query: wrapped, on this connection only, to watch its failures. */
  query?: (...args: never[]) => unknown;
  /** Closes the connection (node-postgres marks it ending at once). */
  end?: () => Promise<unknown>;
}

const watched = new WeakSet<object>();

/**
 * Makes `client` end itself as soon as one of its queries fails with a lost connection
 * ({@link isConnectionLoss}), whoever sent the query. Once per connection (a second call does
 * nothing); a client without `query` or `end` is left as it is. The goodbye is not awaited: a
 * silent network may never answer it.
 *
 * @example
 * ```ts
 * import pg from 'pg';
 * import { endOnLoss } from '@lockkit/core/adapter';
 * const pool = new pg.Pool();
 * pool.on('connect', (client) => endOnLoss(client));
 * ```
 */
export function endOnLoss(client: LossEndableClientLike): void {
  const { query, end } = client;
  if (watched.has(client) || typeof query !== 'function' || typeof end !== 'function') return;
  watched.add(client);
  client.query = function (this: unknown, ...args: never[]): unknown {
    const result = query.apply(this, args);
    if (typeof (result as PromiseLike<unknown> | undefined)?.then === 'function')
      (result as PromiseLike<unknown>).then(undefined, (error: unknown) => {
        if (isConnectionLoss(error)) void end.call(client).catch(() => {});
      });
    return result;
  };
}
