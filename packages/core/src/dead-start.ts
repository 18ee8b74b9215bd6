/**
 * A transaction whose pooled connection turns out dead before lockkit's callback runs is begun
 * once more, on another connection. A pool lends an idle connection as live until its client has
 * read the server's goodbye: a backend terminated a moment ago (by an operator, a failover, an idle
 * timeout) still looks live, and the first statement sent on it — the driver's BEGIN — fails. Go's
 * `database/sql` answers the same race the same way (a driver's `ErrBadConn`, returned only while
 * nothing was sent, makes it take another connection).
 *
 * @packageDocumentation
 */
import { isConnectionLoss } from './connection-loss.js';
import { isLockkitError } from './errors.js';
import { sqlState } from './postgres-errors.js';

/**
 * Codes of a connection that never came (refused, unreachable, timed out, a server starting up):
 * no stale connection was lent, and trying again would only double the caller's wait.
 */
const NEVER_CONNECTED =
  /^(08001|08004|57P03|E(CONNREFUSED|TIMEDOUT|HOSTUNREACH|HOSTDOWN|NETUNREACH|NETDOWN|ADDRNOTAVAIL|AI_AGAIN|NOTFOUND)|CONNECTION_CONNECT_TIMEOUT|P1001)$/;

/** Whether `error`, or what it wraps (`cause`, `meta`), carries a code of {@link NEVER_CONNECTED}. */
function neverConnected(error: unknown): boolean {
  let current: unknown = error;
  for (let depth = 0; depth < 4 && typeof current === 'object' && current !== null; depth++) {
    const { code, meta, cause } = current as {
      code?: unknown;
      meta?: { code?: unknown };
      cause?: unknown;
    };
    for (const candidate of [sqlState(current), code, meta?.code]) {
      if (typeof candidate === 'string' && NEVER_CONNECTED.test(candidate)) return true;
    }
    current = cause;
  }
  return false;
}

/**
 * Runs `body` in a transaction begun by `begin` (an adapter's own "take a pooled connection, BEGIN,
 * run the callback, COMMIT"), and begins once more when the first attempt failed with a lost
 * connection before `body` was called.
 *
 * Safe because of what "before `body`" means: the only statement that can have reached the server
 * is the driver's BEGIN (and its transaction settings), and a transaction that never saw COMMIT
 * leaves nothing behind. Only for adapters whose `begin` sends nothing else before the callback:
 * not for a pipelined opening, whose first statement travels with BEGIN or before it. For the retry
 * to find a live connection, the adapter must make its pool discard the dead one (node-postgres's
 * pool does when the connection is released with its error, or has been ended). Once only: a second
 * dead connection in a row is no race but a server that is gone, and the caller hears it.
 *
 * @example
 * ```ts
 * import { retryDeadStart } from '@lockkit/core/adapter';
 * import type { LockExecutor } from '@lockkit/core';
 * declare const begin: LockExecutor<unknown, never>['transaction'];
 * const executor: LockExecutor<unknown, never> = {
 *   name: 'my-driver',
 *   transaction: (fn) => retryDeadStart(begin, fn),
 * };
 * ```
 */
export async function retryDeadStart<C, T>(
  begin: (body: (ctx: C) => Promise<T>) => Promise<T>,
  body: (ctx: C) => Promise<T>,
): Promise<T> {
  let entered = false;
  const enter = (ctx: C): Promise<T> => {
    entered = true;
    return body(ctx);
  };
  try {
    return await begin(enter);
  } catch (error) {
    // lockkit's own verdicts (an adapter's refusal of a connection, say) are the caller's to hear.
    if (entered || isLockkitError(error) || !isConnectionLoss(error) || neverConnected(error))
      throw error;
    return begin(enter);
  }
}
