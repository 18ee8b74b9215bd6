export {
  isLockkitError,
  LockKeyError,
  type LockKeyErrorCode,
  LockkitError,
  type LockkitErrorCode,
  type LockkitErrorOptions,
  UnsupportedCapabilityError,
} from './errors.js';
export {
  assertLockExecutor,
  type ExecutorCapability,
  hasCapability,
  type LockExecutor,
  type QueryFn,
  type Row,
  requireCapability,
  type SessionContext,
  type TransactionContext,
} from './executor.js';
export {
  generateLockKeys,
  LockKey,
  MAX_KEY_NAME_BYTES,
  type PgLocksCoordinates,
  type PgLocksRow,
} from './keys.js';
