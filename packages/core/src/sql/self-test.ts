/**
 * The statements of the engine self-test (`engine-self-test.ts`): a first session takes an
 * advisory lock, a second one looks for it in `pg_locks` and tries to take it too.
 *
 * The lock functions are called unqualified, exactly as every lock statement of lockkit calls
 * them: the self-test must exercise what `search_path` makes of those names (a stub schema put
 * ahead of `pg_catalog` is one of the fakes it exists to catch). The catalog views it reads are
 * qualified, so that nothing on the path can stand in for them.
 *
 * Values are inlined so that each statement can travel pipelined with BEGIN: lock keys validated
 * by {@link LockKey}, and a backend pid checked here.
 *
 * @packageDocumentation
 */
import { LockkitError } from '../errors.js';
import type { LockKey } from '../keys.js';
import { BACKEND_PID, inlineKeyArguments } from './locks.js';

/** The two keys of one self-test run: one in each advisory-lock key space. */
export interface SelfTestKeys {
  /** An int4-pair key (`objsubid` 2). */
  readonly pair: LockKey;
  /** An int8 key (`objsubid` 1). */
  readonly int8: LockKey;
}

function inlinePid(pid: unknown): string {
  if (typeof pid !== 'number' || !Number.isInteger(pid) || pid <= 0 || pid > 2 ** 31 - 1) {
    throw new LockkitError('EXECUTOR_INVALID', `not a backend pid: ${String(pid)}`);
  }
  return `${pid}::int4`;
}

/** Whether backend `pid` (an SQL expression) holds `key` exclusively, granted, in this database. */
function grantedTo(pid: string, key: LockKey): string {
  const { classid, objid, objsubid } = key.pgLocks;
  return `EXISTS (SELECT 1 FROM pg_catalog.pg_locks l
      WHERE l.locktype = 'advisory' AND l.granted AND l.mode = 'ExclusiveLock' AND l.pid = ${pid}
        AND l.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())
        AND l.classid = ${classid}::int8::oid AND l.objid = ${objid}::int8::oid
        AND l.objsubid = ${objsubid}::int2)`;
}

/**
 * The first session's statement: its backend (`pid`), both try-locks (`pair`, `int8`) and the
 * server's `version()` (`server`), in one statement so that it costs no round trip of its own.
 */
export function selfTestTakeStatement(keys: SelfTestKeys): string {
  return `${BACKEND_PID}, pg_try_advisory_xact_lock(${inlineKeyArguments(keys.pair)}) AS pair,
    pg_try_advisory_xact_lock(${inlineKeyArguments(keys.int8)}) AS int8, version() AS server`;
}

/**
 * The second session's statement, while the first one (backend `holderPid`) still holds both
 * keys: whether `pg_locks` shows them granted to that backend (`pair_seen`, `int8_seen`), and
 * whether this session can take them too (`pair_taken`, `int8_taken`; on a real server, false).
 * Also its own backend (`pid`). Any lock it does take goes with its rollback.
 */
export function selfTestSecondSessionStatement(keys: SelfTestKeys, holderPid: number): string {
  const pid = inlinePid(holderPid);
  // YugabyteDB hides transactions younger than `yb_locks_min_txn_age` (1 s by default) from
  // pg_locks, which would make its real advisory locks look fake: where that setting exists, this
  // transaction sets it to 0 first (columns are evaluated in order). Elsewhere the subquery finds
  // no such setting and does nothing. Not run against YugabyteDB here.
  return `${BACKEND_PID}, (SELECT set_config(name, '0', true) FROM pg_catalog.pg_settings
      WHERE name = 'yb_locks_min_txn_age') AS yb_locks_min_txn_age,
    ${grantedTo(pid, keys.pair)} AS pair_seen,
    ${grantedTo(pid, keys.int8)} AS int8_seen,
    pg_try_advisory_xact_lock(${inlineKeyArguments(keys.pair)}) AS pair_taken,
    pg_try_advisory_xact_lock(${inlineKeyArguments(keys.int8)}) AS int8_taken`;
}

/**
 * The fallback when no second session could be had (one connection only): in the first session
 * itself, whether `pg_locks` shows both keys granted to its own backend (`pair_seen`,
 * `int8_seen`).
 */
export function selfTestSameSessionStatement(keys: SelfTestKeys): string {
  return `SELECT ${grantedTo('pg_backend_pid()', keys.pair)} AS pair_seen,
    ${grantedTo('pg_backend_pid()', keys.int8)} AS int8_seen`;
}

/**
 * Who the server is, for `lockkit doctor`: `version`, `system_identifier` (from
 * `pg_control_system()`, as text: it does not fit a JavaScript number) and `timeline` (from
 * `pg_control_checkpoint()`: the timeline of the LAST CHECKPOINT, which lags a promotion until the
 * next checkpoint). The two control functions are NULL, not an error, when this user may not
 * execute them.
 */
export const SERVER_IDENTITY = `SELECT version() AS version,
  CASE WHEN has_function_privilege('pg_catalog.pg_control_system()', 'EXECUTE')
       THEN (SELECT system_identifier::text FROM pg_catalog.pg_control_system()) END AS system_identifier,
  CASE WHEN has_function_privilege('pg_catalog.pg_control_checkpoint()', 'EXECUTE')
       THEN (SELECT timeline_id FROM pg_catalog.pg_control_checkpoint()) END AS timeline`;

/** The fallback of {@link SERVER_IDENTITY} on an engine without the control functions. */
export const SERVER_VERSION = 'SELECT version() AS version';
