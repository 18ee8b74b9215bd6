export {
  type Clock,
  type ClockTimer,
  MAX_TIMER_MS,
  SimulatedClock,
  systemClock,
} from './clock.js';
export { type DoctorCheck, type DoctorOptions, doctor } from './doctor.js';
export type { EngineSelfTestResult } from './engine-self-test.js';
export {
  AfterCommitError,
  CommitOutcomeUnknownError,
  CommitRolledBackError,
  ConnectionLostError,
  DeadlockError,
  EngineLocksNotRealError,
  isLockkitError,
  LeaseLostError,
  LockKeyError,
  type LockKeyErrorCode,
  LockkitError,
  type LockkitErrorCode,
  type LockkitErrorOptions,
  LockNotHeldError,
  LockTableFullError,
  LockTimeoutError,
  NotPrimaryError,
  TransactionExpiredError,
  UnsafeBehindPoolerError,
  UnsupportedCapabilityError,
} from './errors.js';
export type {
  LockEventBase,
  LockkitEvent,
  LockkitEventListener,
} from './events.js';
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
  type InspectedJob,
  type InspectedLease,
  type InspectedLock,
  type InspectedRun,
  type Inspection,
  type InspectOptions,
  inspect,
  KeyNames,
  type LockSample,
  type LockTableCapacity,
  type SampledLock,
  sampleLocks,
} from './inspect.js';
export {
  generateLockKeys,
  LockKey,
  MAX_KEY_NAME_BYTES,
  type PgLocksCoordinates,
  type PgLocksRow,
} from './keys.js';
export type {
  LeaseContext,
  LeaseHolder,
  LeaseOperations,
  LeaseOptions,
  LeaseRef,
  LeaseResult,
  LeaseTask,
} from './lease.js';
export { type FencingTokenParts, tokenParts } from './lease.js';
export {
  type AcquireOptions,
  createLockClient,
  type ExclusiveJobOptions,
  type JobResult,
  type LockClient,
  type LockClientOptions,
  type SessionLockOptions,
  type SessionTask,
  type TaskContext,
  type TransactionLockOptions,
  type TransactionTask,
} from './lock.js';
export { DEFAULT_SCHEMA, type MigrationResult, migrate } from './migrate.js';
export { fromPostgresError, sqlState } from './postgres-errors.js';
export {
  type CatchUpPolicy,
  createScheduler,
  type JobHandler,
  type JobOptions,
  type LeaseJobHandler,
  type LeaseJobOptions,
  type LeaseRun,
  type OverlapPolicy,
  type RunInfo,
  SCHEDULER_NAMESPACE,
  SCHEDULER_OUTCOMES,
  type ScheduleRegistration,
  Scheduler,
  type SchedulerEvent,
  type SchedulerEventType,
  type SchedulerOptions,
  type TransactionJobHandler,
  type TransactionJobOptions,
  type TransactionRun,
} from './scheduler.js';
export {
  type DetectPoolerOptions,
  detectPooler,
  type PoolerVerdict,
} from './session-pinning.js';
export { quoteIdentifier } from './sql/identifiers.js';
export {
  type LockMode,
  type LockScope,
  MAX_TIMEOUT_MS,
  type Statement,
} from './sql/locks.js';
