/**
 * The lock engine: every lock operation users call, written once over any {@link LockExecutor}.
 * {@link createLockClient} binds them to one executor; the operations themselves live in their own
 * modules over a small engine context: `transaction-lock.ts`, `session-lock.ts`, `lock-wait.ts`
 * (waiting and cancelling) and `lock-engine.ts` (what they share).
 *
 * @packageDocumentation
 */
import { EngineTrust } from './engine-self-test.js';
import { LockkitError } from './errors.js';
import { emitter } from './events.js';
import { assertLockExecutor, type LockExecutor } from './executor.js';
import { leaseOperations } from './lease.js';
import { type LockEngine, namedKey } from './lock-engine.js';
import type {
  ExclusiveJobOptions,
  JobResult,
  LockClient,
  LockClientOptions,
  SessionLockOptions,
  SessionTask,
  TransactionLockOptions,
  TransactionTask,
} from './lock-types.js';
import { DEFAULT_SCHEMA, migrate } from './migrate.js';
import { sessionLock } from './session-lock.js';
import { SessionPinning } from './session-pinning.js';
import { quoteIdentifier } from './sql/identifiers.js';
import { checkMilliseconds } from './sql/locks.js';
import { transactionLock } from './transaction-lock.js';

export type {
  AcquireOptions,
  ExclusiveJobOptions,
  JobResult,
  LockClient,
  LockClientOptions,
  SessionLockOptions,
  SessionTask,
  TaskContext,
  TransactionLockOptions,
  TransactionTask,
} from './lock-types.js';

/**
 * Binds the lock operations to an executor. Adapters wrap this as `createLockKit(handle)`.
 * @throws {@link LockkitError} `EXECUTOR_INVALID` when `executor` is not a LockExecutor.
 */
export function createLockClient<Tx, Session>(
  executor: LockExecutor<Tx, Session>,
  options: LockClientOptions = {},
): LockClient<Tx, Session> {
  assertLockExecutor(executor);
  if (options.oneRoundTripSkip !== undefined && typeof options.oneRoundTripSkip !== 'boolean')
    throw new LockkitError('OPTION_INVALID', 'oneRoundTripSkip must be a boolean.');
  if (options.engineSelfTest !== undefined && typeof options.engineSelfTest !== 'boolean')
    throw new LockkitError('OPTION_INVALID', 'engineSelfTest must be a boolean.');
  const engine: LockEngine<Tx, Session> = {
    executor,
    emit: emitter(options.onEvent),
    oneTripSkips: options.oneRoundTripSkip === true && executor.firstThenBegin !== undefined,
    defaults: {
      ...(options.statementTimeoutMs !== undefined && {
        statementTimeoutMs: checkMilliseconds(options.statementTimeoutMs, 'statementTimeoutMs', 0),
      }),
      ...(options.idleInTransactionTimeoutMs !== undefined && {
        idleInTransactionTimeoutMs: checkMilliseconds(
          options.idleInTransactionTimeoutMs,
          'idleInTransactionTimeoutMs',
          0,
        ),
      }),
    },
    pinning: new SessionPinning(executor),
    poolerDetected: false,
    trust: new EngineTrust(executor as LockExecutor, options.engineSelfTest !== false),
  };

  const withLock = <T>(
    key: Parameters<LockClient<Tx, Session>['withLock']>[0],
    task: TransactionTask<Tx, T>,
    callOptions?: TransactionLockOptions,
  ): Promise<JobResult<T>> => transactionLock(engine, key, task, callOptions);
  const withSessionLock = <T>(
    key: Parameters<LockClient<Tx, Session>['withSessionLock']>[0],
    task: SessionTask<Session, T>,
    callOptions?: SessionLockOptions,
  ): Promise<JobResult<T>> => sessionLock(engine, key, task, callOptions);

  const schemaName = options.schema ?? DEFAULT_SCHEMA;
  const leases = leaseOperations(
    executor,
    (key, task, claimOptions) => withLock(key, (_tx, ctx) => task(ctx.query), claimOptions),
    quoteIdentifier(schemaName),
    engine.emit,
  );

  return Object.freeze({
    executor,
    schema: schemaName,
    statementTimeoutMs: engine.defaults.statementTimeoutMs,
    withLock,
    withSessionLock,
    ...leases,
    migrate: () => migrate(executor as LockExecutor, { schema: schemaName }),
    verifyEngine: () => engine.trust.verify(),
    async runExclusiveJob<T>(
      namespace: string,
      jobKey: string,
      task: TransactionTask<Tx, T>,
      jobOptions: ExclusiveJobOptions = {},
    ): Promise<JobResult<T>> {
      const { signal, statementTimeoutMs, idleInTransactionTimeoutMs } = jobOptions;
      return withLock(namedKey(namespace, jobKey), task, {
        ...(signal !== undefined && { signal }),
        ...(statementTimeoutMs !== undefined && { statementTimeoutMs }),
        ...(idleInTransactionTimeoutMs !== undefined && { idleInTransactionTimeoutMs }),
      });
    },
  });
}
