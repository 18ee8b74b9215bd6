/**
 * Every SQL statement lockkit sends to Postgres, in one place.
 *
 * Values always travel as parameters, with one exception: a statement that an adapter may send
 * pipelined with BEGIN in one simple-protocol query, which cannot carry parameters. Those inline
 * only values this module has validated itself: integer lock keys (checked by {@link LockKey})
 * and integer millisecond settings (checked by {@link checkMilliseconds}).
 *
 * @packageDocumentation
 */
import { LockkitError } from '../errors.js';
import type { LockKey } from '../keys.js';

/** Exclusive locks exclude everyone; shared locks exclude only exclusive ones. */
export type LockMode = 'exclusive' | 'shared';

/** `transaction`: released at COMMIT/ROLLBACK. `session`: held until unlocked or disconnected. */
export type LockScope = 'transaction' | 'session';

/** Session settings lockkit may set for one transaction (`SET LOCAL`). */
export type TransactionSetting =
  | 'lock_timeout'
  | 'statement_timeout'
  | 'idle_in_transaction_session_timeout';

/** A setting and its value in milliseconds, validated by {@link checkMilliseconds}. */
export type SettingValue = readonly [TransactionSetting, number];

/** A statement with positional parameters. */
export interface Statement {
  readonly text: string;
  readonly params: readonly unknown[];
}

/**
 * For adapters whose driver cannot tell when a connection dies: the server pid of the current
 * connection (one row, `pid`), to watch it with {@link deadBackendsStatement}.
 *
 * Every statement of lockkit's whose text starts with this one reports the transaction's own
 * backend in `pid` (the opening try-lock, the waiting lock's preparation, the guarded session lock
 * and unlock); no other statement does. An executor may rely on that prefix to learn its pid from
 * the first statement of a transaction instead of asking separately.
 */
export const BACKEND_PID = 'SELECT pg_backend_pid() AS pid';

/**
 * A column of every statement that opens lockkit's transaction: when that transaction started, as
 * exact text. Read again before COMMIT ({@link TRANSACTION_STARTED_STATEMENT}), a different value
 * means the task ended lockkit's transaction itself (COMMIT, ROLLBACK, COMMIT AND CHAIN…) and the
 * transaction-scoped lock went with it.
 */
export const TRANSACTION_STARTED = 'extract(epoch FROM transaction_timestamp())::text AS began';

/**
 * A column naming the current transaction for a later question about how it ended: `xid`, its
 * transaction id (assigned now if it had none), as text. See {@link TRANSACTION_STATUS}.
 */
export const TRANSACTION_ID = 'txid_current()::text AS xid';

/**
 * One row, `status`, how transaction `$1` (an {@link TRANSACTION_ID}) ended as this server knows
 * it: `committed`, `aborted`, `in progress`, or null when the id is too old to tell. An id this
 * server never issued (a standby promoted before it received the transaction) is an error.
 */
export const TRANSACTION_STATUS = 'SELECT txid_status($1::int8) AS status';

/** One row, `began`: the current transaction's start, as in {@link TRANSACTION_STARTED}. */
export const TRANSACTION_STARTED_STATEMENT = `SELECT ${TRANSACTION_STARTED}`;

/**
 * A column of every statement that takes an advisory lock: `in_recovery`, true on a hot standby.
 * A standby grants advisory locks, but only among its own sessions: every instance reaching a
 * replica would hold "the" lock at once. Reported by the very statement that takes the lock (no
 * round trip of its own), so that the lock proves itself where it is taken.
 */
export const IN_RECOVERY = 'pg_catalog.pg_is_in_recovery() AS in_recovery';

/**
 * `call` (a lock function's call) evaluated only on a server that is not in recovery: on a
 * standby the expression is NULL and no lock is taken, so there is nothing to release.
 */
export function onPrimary(call: string): string {
  return `CASE WHEN pg_catalog.pg_is_in_recovery() THEN NULL ELSE ${call} END`;
}

/** Largest value Postgres accepts for a millisecond timeout setting (INT_MAX). */
export const MAX_TIMEOUT_MS = 2_147_483_647;

/**
 * Validates a millisecond option: an integer from `min` to {@link MAX_TIMEOUT_MS}.
 * @throws {@link LockkitError} `OPTION_INVALID`.
 */
export function checkMilliseconds(value: unknown, name: string, min: number): number {
  if (
    typeof value !== 'number' ||
    !Number.isInteger(value) ||
    value < min ||
    value > MAX_TIMEOUT_MS
  ) {
    throw new LockkitError(
      'OPTION_INVALID',
      `${name} must be an integer number of milliseconds from ${min} to ${MAX_TIMEOUT_MS}, got ${String(value)}.`,
    );
  }
  return value;
}

function lockFunction(scope: LockScope, mode: LockMode, wait: boolean, unlock = false): string {
  const shared = mode === 'shared' ? '_shared' : '';
  if (unlock) return `pg_advisory_unlock${shared}`;
  return `pg_${wait ? '' : 'try_'}advisory_${scope === 'transaction' ? 'xact_' : ''}lock${shared}`;
}

function keyArguments(key: LockKey): Statement {
  if (key.pair) return { text: '$1::int4, $2::int4', params: [key.pair[0], key.pair[1]] };
  return { text: '$1::int8', params: [String(key.int8)] };
}

/** A key's arguments inlined (validated integers only), for statements pipelined with BEGIN. */
export function inlineKeyArguments(key: LockKey): string {
  // Safe to inline: LockKey holds only validated int4 numbers or an int8 bigint.
  if (key.pair) return `(${key.pair[0] | 0})::int4, (${key.pair[1] | 0})::int4`;
  return `(${BigInt.asIntN(64, key.int8 as bigint)})::int8`;
}

/**
 * Takes the lock, as one statement returning one row with a boolean `acquired` and
 * {@link IN_RECOVERY}. Try-locks return whether they got it; waiting locks return true once they
 * have it (or fail with 55P03). On a standby neither takes anything: `acquired` is NULL.
 */
export function lockStatement(
  key: LockKey,
  scope: LockScope,
  mode: LockMode,
  wait: boolean,
): Statement {
  const args = keyArguments(key);
  const fn = lockFunction(scope, mode, wait);
  // Session locks report the backend that holds them, so the release can go to that one only.
  const pid = scope === 'session' ? 'pg_backend_pid() AS pid, ' : '';
  // A waiting lock's function returns void: its scalar subquery runs only when the CASE needs it.
  const call = wait ? `(SELECT true FROM ${fn}(${args.text}))` : `${fn}(${args.text})`;
  const text = `SELECT ${pid}${onPrimary(call)} AS acquired, ${IN_RECOVERY}`;
  return { text, params: args.params };
}

/**
 * The try-lock of {@link lockStatement} (transaction scope) with the given settings applied in the
 * same statement, values inlined so that it can be pipelined with BEGIN. Returns `acquired`,
 * `began` ({@link TRANSACTION_STARTED}), `in_recovery` ({@link IN_RECOVERY}), and `pid` first
 * (see {@link BACKEND_PID}): an executor that must watch the backend learns it here, without a
 * statement of its own.
 */
export function inlineTryLockStatement(
  key: LockKey,
  mode: LockMode,
  settings: readonly SettingValue[],
): string {
  const fn = lockFunction('transaction', mode, false);
  return `${BACKEND_PID}, ${[...inlineSettings(settings), `${onPrimary(`${fn}(${inlineKeyArguments(key)})`)} AS acquired`, TRANSACTION_STARTED, IN_RECOVERY].join(', ')}`;
}

/**
 * The text a one-round-trip try-lock raises, inside a 22P02 error, when the lock is held elsewhere.
 */
export const SKIP_MARKER = 'lockkit:skip';

/**
 * The text a one-round-trip try-lock raises, inside a 22P02 error, on a server in recovery (a hot
 * standby): no lock is taken, the block rolls back, nothing runs.
 */
export const STANDBY_MARKER = 'lockkit:standby';

/**
 * The try-lock of {@link inlineTryLockStatement}, written to fail when the lock is not granted:
 * `'true'` or {@link SKIP_MARKER} cast to boolean, so a held lock raises 22P02 with the marker
 * (and a server in recovery, checked first, raises it with {@link STANDBY_MARKER}, taking nothing).
 * Sent as `<this>; BEGIN` in one simple query: on success the lock is held inside the transaction
 * the BEGIN opens; on failure the implicit block rolls back and the connection is idle, after
 * one round trip.
 */
export function oneTripTryLockStatement(
  key: LockKey,
  mode: LockMode,
  settings: readonly SettingValue[],
): string {
  const fn = lockFunction('transaction', mode, false);
  const decision = `(CASE WHEN pg_catalog.pg_is_in_recovery() THEN '${STANDBY_MARKER}' WHEN ${fn}(${inlineKeyArguments(key)}) THEN 'true' ELSE '${SKIP_MARKER}' END)::boolean AS acquired`;
  return `SELECT ${[...inlineSettings(settings), decision, TRANSACTION_STARTED].join(', ')}`;
}

function inlineSettings(settings: readonly SettingValue[]): string[] {
  return settings.map(
    ([name, ms], i) => `set_config('${name}', '${checkMilliseconds(ms, name, 0)}', true) AS s${i}`,
  );
}

/**
 * Applies settings for the current transaction and reports the backend pid (needed to cancel a
 * wait from another connection). Inlined values, so it can be pipelined with BEGIN. Returns `pid`.
 */
export function inlinePrepareStatement(settings: readonly SettingValue[]): string {
  return [BACKEND_PID, ...inlineSettings(settings), TRANSACTION_STARTED].join(', ');
}

/**
 * A session lock taken only on the connection the driver believes it has: returns `pid`
 * (`pg_backend_pid()`), {@link IN_RECOVERY} and `acquired`, which is NULL — and no lock is taken —
 * when the pid differs from `driverPid`, i.e. a pooler has put this statement on another server
 * connection, or when the server is in recovery.
 */
export function guardedSessionLockStatement(
  key: LockKey,
  mode: LockMode,
  wait: boolean,
  driverPid: number,
): Statement {
  const args = keyArguments(key);
  const fn = lockFunction('session', mode, wait);
  const call = wait ? `(SELECT true FROM ${fn}(${args.text}))` : `${fn}(${args.text})`;
  const pid = `$${args.params.length + 1}::int4`;
  return {
    text: `${BACKEND_PID}, CASE WHEN pg_backend_pid() = ${pid} AND NOT pg_catalog.pg_is_in_recovery() THEN ${call} END AS acquired, ${IN_RECOVERY}`,
    params: [...args.params, driverPid],
  };
}

/**
 * Releases one level of a session lock, only on backend `holderPid` (the one that took it): one
 * row with `pid` and a boolean `released`, NULL when this statement reached another backend —
 * then nothing is unlocked, so a lock of someone else's is never released by mistake.
 */
export function unlockStatement(key: LockKey, mode: LockMode, holderPid: number): Statement {
  const args = keyArguments(key);
  const pid = `$${args.params.length + 1}::int4`;
  return {
    text: `${BACKEND_PID}, CASE WHEN pg_backend_pid() = ${pid} THEN ${lockFunction('session', mode, false, true)}(${args.text}) END AS released`,
    params: [...args.params, holderPid],
  };
}

/**
 * Like {@link unlockStatement}, then frees every further hold of `key` this backend still has at
 * session level, in both modes (a task that took its own key again): `leftover` counts them. Only
 * on backend `holderPid`; a connection goes back to its pool holding nothing of this key.
 */
export function sessionReleaseStatement(
  key: LockKey,
  mode: LockMode,
  holderPid: number,
): Statement {
  const args = keyArguments(key);
  const pid = `$${args.params.length + 1}::int4`;
  const { classid, objid, objsubid } = key.pgLocks;
  const drain = (lockMode: LockMode) => {
    const fn = lockFunction('session', lockMode, false, true);
    const pgMode = lockMode === 'shared' ? 'ShareLock' : 'ExclusiveLock';
    // One unlock per level, while pg_locks still shows a hold (a CASE, so that no unlock of a
    // lock not held is ever attempted: that would raise a WARNING).
    return `(WITH RECURSIVE u(n) AS (SELECT 0 UNION ALL SELECT u.n + 1 FROM u WHERE u.n < 10000 AND CASE WHEN EXISTS (SELECT 1 FROM pg_locks l WHERE u.n >= 0 AND l.pid = pg_backend_pid() AND l.locktype = 'advisory' AND l.granted AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) AND l.classid = ${BigInt(classid)}::int8::oid AND l.objid = ${BigInt(objid)}::int8::oid AND l.objsubid = ${Number(objsubid) | 0}::int2 AND l.mode = '${pgMode}') THEN ${fn}(${args.text}) ELSE false END) SELECT count(*) - 1 FROM u)`;
  };
  return {
    text: `${BACKEND_PID}, CASE WHEN pg_backend_pid() = ${pid} THEN ${lockFunction('session', mode, false, true)}(${args.text}) END AS released, CASE WHEN pg_backend_pid() = ${pid} THEN ${drain('exclusive')} + ${drain('shared')} END AS leftover`,
    params: [...args.params, holderPid],
  };
}

/**
 * Lifts `statement_timeout` for the rest of the session: sent outside any transaction, on a session
 * connection whose task left a timeout too short for lockkit's release. The connection is
 * discarded after the task (closed, or reset in full), so the lift outlives nothing. A utility
 * statement, not a SELECT: it is neither planned nor JIT-compiled, which under a forced JIT takes
 * longer than a 1 ms timeout every time.
 */
export const NO_STATEMENT_TIMEOUT = 'SET statement_timeout = 0';

/**
 * Resets a session connection, for an executor that cannot close one pooled connection without
 * hurting its other queries: role and session authorization, settings (custom ones too), cursors,
 * LISTEN, advisory locks, temporary objects, sequences' state and SQL-level prepared statements.
 * Unlike `DISCARD ALL`, it keeps the protocol-level prepared statements a driver caches (dropping
 * them under postgres.js corrupts its queue). One simple-protocol query; fails inside a
 * transaction block.
 */
export const SESSION_RESET = [
  'CLOSE ALL',
  'SET SESSION AUTHORIZATION DEFAULT',
  'RESET ALL',
  'UNLISTEN *',
  'SELECT pg_advisory_unlock_all()',
  'DISCARD TEMP',
  'DISCARD SEQUENCES',
  `DO $lockkit$ DECLARE n text; BEGIN
     FOR n IN SELECT name FROM pg_prepared_statements WHERE from_sql LOOP
       EXECUTE format('DEALLOCATE %I', n);
     END LOOP;
   END $lockkit$`,
].join('; ');

/**
 * Sent on a connection about to be ended by {@link END_OWN_BACKEND}: a task may have switched to a
 * role that may not end its own backend (SET ROLE, SET SESSION AUTHORIZATION). Back to the
 * authenticated user first; both are allowed to any session, outside a transaction.
 */
export const RESET_AUTHORIZATION = ['SET SESSION AUTHORIZATION DEFAULT', 'RESET ROLE'] as const;

/**
 * First half of the transaction-block probe, for executors that cannot tell whether a connection
 * is inside a transaction: sets a transaction-local marker. Must travel alone (its own implicit
 * transaction), followed by {@link TRANSACTION_PROBE_READ}.
 */
export const TRANSACTION_PROBE_SET = "SELECT set_config('lockkit.open_transaction', 'yes', true)";

/**
 * Second half of the probe: `open` is true only inside a transaction block, where the marker of
 * {@link TRANSACTION_PROBE_SET} outlived its statement; it fails with 25P02 in an aborted one.
 */
export const TRANSACTION_PROBE_READ =
  "SELECT coalesce(current_setting('lockkit.open_transaction', true), '') = 'yes' AS open";

/**
 * Whether this connection holds `key` in `mode` at session or transaction level: one row with an
 * integer `held` (the levels held). Used after a failed session wait, since a wait cut short at
 * the very moment the lock was granted leaves a session lock that survives the rollback.
 */
export function heldStatement(key: LockKey, mode: LockMode): Statement {
  const { classid, objid, objsubid } = key.pgLocks;
  return {
    text: `SELECT count(*)::int AS held FROM pg_locks
            WHERE pid = pg_backend_pid() AND locktype = 'advisory' AND granted
              AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
              AND classid = $1::int8::oid AND objid = $2::int8::oid AND objsubid = $3::int2
              AND mode = $4`,
    params: [classid, objid, objsubid, mode === 'shared' ? 'ShareLock' : 'ExclusiveLock'],
  };
}

/**
 * Cancels the lock wait of backend `pid` on `key`, sent from another connection, and only while
 * that backend is still waiting for that very lock: once it was granted (and its connection
 * perhaps handed to someone else), the statement cancels nothing.
 */
export function cancelWaitStatement(pid: number, key: LockKey): Statement {
  const { classid, objid, objsubid } = key.pgLocks;
  return {
    text: `SELECT pg_cancel_backend(l.pid) AS cancelled FROM pg_locks l
            WHERE l.pid = $1::int4 AND l.locktype = 'advisory' AND NOT l.granted
              AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
              AND l.classid = $2::int8::oid AND l.objid = $3::int8::oid AND l.objsubid = $4::int2`,
    params: [checkPid(pid), classid, objid, objsubid],
  };
}

/**
 * Ends the backend of the connection it is sent on: for an executor that cannot close one pooled
 * connection itself, yet must never lend it again (a cancel may still be on its way to it).
 */
export const END_OWN_BACKEND = 'SELECT pg_terminate_backend(pg_backend_pid())';

/** Which of `pids` no longer have a backend: rows of `pid`. */
export function deadBackendsStatement(pids: readonly number[]): Statement {
  return {
    text: `SELECT p.pid FROM unnest($1::int4[]) AS p(pid)
            WHERE NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = p.pid)`,
    params: [pids.map((pid) => checkPid(pid))],
  };
}

function checkPid(pid: number): number {
  if (!Number.isInteger(pid) || pid <= 0 || pid > 2 ** 31 - 1) {
    throw new LockkitError('OPTION_INVALID', `not a backend pid: ${String(pid)}`);
  }
  return pid;
}

/** Transaction control sent by core on a session connection (session-scoped blocking waits). */
export const BEGIN = 'BEGIN';
/** See {@link BEGIN}. */
export const COMMIT = 'COMMIT';
/** See {@link BEGIN}. */
export const ROLLBACK = 'ROLLBACK';
