/**
 * `@lockkit/core/adapter`: what adapter authors need and users never call — watching a leased
 * connection, knowing a lost connection when they see one, cancelling a statement with the
 * protocol's own request, the statements an adapter may send on its own, core's check of a
 * millisecond option (for integrations that take lock options before the first lock call), and the
 * shield against postgres.js's stale FATAL (for every adapter that runs on postgres.js).
 *
 * @packageDocumentation
 */

export {
  BackendWatch,
  type BackendWatchOptions,
  type RunStatement,
  type WatchedBackend,
} from './backend-watch.js';
export { type CancelTarget, sendCancelRequest } from './cancel-request.js';
export { ConnectionFate, FateTransactionContext } from './connection-fate.js';
export { isConnectionLoss } from './connection-loss.js';
export {
  type ConnectionSlot,
  guardCheckouts,
  type PgEventSourceLike,
  type PgPoolEventsLike,
  slotOf,
} from './connection-slots.js';
export { retryDeadStart } from './dead-start.js';
export { endOnLoss, type LossEndableClientLike } from './end-on-loss.js';
export { TaskFailure } from './lock-engine.js';
export { NestedCallGuard } from './nested-call.js';
export {
  type ShieldReservedLike,
  type ShieldSqlLike,
  type StaleFatalShield,
  staleFatalShield,
} from './postgres-js-stale-fatal.js';
export { inTransactionBlock, inTransactionFrom, type ReadyStatusSource } from './ready-status.js';
export {
  BACKEND_PID,
  checkMilliseconds,
  END_OWN_BACKEND,
  RESET_AUTHORIZATION,
  SESSION_RESET,
} from './sql/locks.js';
