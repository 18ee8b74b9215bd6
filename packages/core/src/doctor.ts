/**
 * Checks that explain what will go wrong before it does: which server this is, whether its advisory
 * locks are real (the engine self-test), a standby, a transaction pooler, timeouts that cut long
 * transactions, a lock table near full, a clock far from the database's.
 *
 * @packageDocumentation
 */
import { type EngineSelfTestResult, runEngineSelfTest } from './engine-self-test.js';
import { assertLockExecutor, type LockExecutor } from './executor.js';
import { REGISTRATION_LIVE_MS } from './ledger.js';
import { DEFAULT_SCHEMA } from './migrate.js';
import { type PoolerVerdict, pinningOf } from './session-pinning.js';
import { quoteIdentifier } from './sql/identifiers.js';
import { LOCK_TABLE_CAPACITY, SERVER_FACTS } from './sql/inspect.js';
import { conflictingSchedulesStatement, SCHEDULES_TABLE_PRESENT } from './sql/scheduler.js';
import { SERVER_IDENTITY, SERVER_VERSION } from './sql/self-test.js';

/** One check's outcome. */
export interface DoctorCheck {
  readonly id:
    | 'server'
    | 'engine-self-test'
    | 'standby'
    | 'pooler'
    | 'idle-in-transaction-timeout'
    | 'statement-timeout'
    | 'tcp-keepalive'
    | 'read-only'
    | 'lock-table'
    | 'clock'
    | 'schedule-conflict';
  readonly level: 'ok' | 'warn' | 'fail';
  readonly message: string;
}

/** What {@link doctor} needs to know beyond what the server says. */
export interface DoctorOptions {
  /**
   * The backend pid the driver got at connect (BackendKeyData), to see a pooler when the executor
   * has no session capability (with one, doctor checks on a session of its own, and tells a
   * session-mode pooler from a transaction-mode one). Omit when unknown.
   */
  readonly driverBackendPid?: number;
  /** This host's clock, ms since the epoch (default `Date.now`). */
  readonly now?: () => number;
  /** Lock-table use above which to warn, 0–1 (default 0.8). */
  readonly lockTableWarnAbove?: number;
  /** Clock difference above which to warn, in ms (default 500). */
  readonly clockWarnMs?: number;
  /** Schema of lockkit's tables, for the scheduler checks (default `lockkit`). */
  readonly schema?: string;
}

const ms = (setting: unknown): number => {
  const text = String(setting ?? '0').trim();
  const match = /^(\d+(?:\.\d+)?)\s*(ms|s|min|h|d)?$/.exec(text);
  if (!match) return 0;
  const value = Number(match[1]);
  const unit = match[2] ?? 'ms';
  return (
    value * ({ ms: 1, s: 1000, min: 60_000, h: 3_600_000, d: 86_400_000 } as const)[unit as 'ms']
  );
};

/** The pooler check's message for each verdict. */
function poolerMessage(verdict: PoolerVerdict): DoctorCheck {
  const id = 'pooler';
  switch (verdict.kind) {
    case 'direct':
      return {
        id,
        level: 'ok',
        message: 'No pooler: the connection reaches the backend it was told about at connect.',
      };
    case 'session-pooler':
      return {
        id,
        level: 'ok',
        message:
          'A pooler in session mode is in the path: each client connection keeps one server backend that no other client reaches, so session locks are safe there (lockkit checks this itself and allows them), as are transaction-scoped locks and leases.',
      };
    case 'transaction-pooler':
      return {
        id,
        level: 'warn',
        message: `A transaction pooler is in the path (${verdict.evidence}). Session-scoped locks would be inherited by other clients: lockkit refuses them — declare transactionPooler: true to refuse them before any SQL. Transaction-scoped locks and leases are fine.`,
      };
    default:
      return {
        id,
        level: 'warn',
        message: `A connection pooler may be in the path and its mode could not be checked (${verdict.reason}). lockkit refuses session-scoped locks through an unchecked pooler; transaction-scoped locks and leases are fine. Run doctor with a pool of two connections or more to tell session mode from transaction mode.`,
      };
  }
}

/**
 * With a session capability: a session of doctor's own, checked as lock clients check theirs.
 * Without: the driver's startup pid against the server's, which shows a pooler but not its mode.
 */
async function poolerCheck(
  executor: LockExecutor,
  driverBackendPid: number | undefined,
  serverPid: number,
): Promise<DoctorCheck | undefined> {
  if (typeof executor.session === 'function') {
    const verdict = await executor.session(async (ctx) =>
      ctx.backendPid === undefined
        ? undefined // the driver reports no startup pid: nothing to compare with
        : (await pinningOf(executor, ctx.query, ctx.backendPid)).verdict,
    );
    if (verdict) return poolerMessage(verdict);
  }
  if (driverBackendPid === undefined) return undefined;
  return driverBackendPid === serverPid
    ? poolerMessage({ kind: 'direct' })
    : poolerMessage({
        kind: 'unverified',
        reason: `the driver was given backend pid ${driverBackendPid} at connect, the server runs backend ${serverPid}; without a session connection doctor cannot tell session mode from transaction mode`,
      });
}

/** Above this idle time (seconds) a dead client's locks are kept too long to call it fine. */
const KEEPALIVE_WARN_ABOVE_S = 600;

/**
 * `tcp_keepalives_idle`: 0 (Postgres's default) means the OS default, 7200 s on Linux, and on a
 * TCP connection the setting reads as that real value, not 0 — so both are looked at.
 */
function keepaliveCheck(effective: unknown, configured: unknown): DoctorCheck {
  const id = 'tcp-keepalive';
  const effectiveS = Number(effective ?? 0) || 0;
  const configuredS = Number(configured ?? 0) || 0;
  const advice =
    'a client that dies without closing its connection (host crash, network cut) keeps its advisory locks until the server notices. Set tcp_keepalives_idle (e.g. 60, with tcp_keepalives_interval 10 and tcp_keepalives_count 6) so the server drops dead connections within minutes.';
  if (configuredS === 0) {
    const seen = effectiveS > 0 ? `: ${effectiveS} s on this connection` : ' (often 7200 s)';
    return {
      id,
      level: 'warn',
      message: `tcp_keepalives_idle is 0, so the OS default applies${seen}: ${advice}`,
    };
  }
  const seconds = effectiveS > 0 ? effectiveS : configuredS;
  return seconds > KEEPALIVE_WARN_ABOVE_S
    ? { id, level: 'warn', message: `tcp_keepalives_idle is ${seconds} s: ${advice}` }
    : { id, level: 'ok', message: `tcp_keepalives_idle is ${seconds} s.` };
}

/**
 * Who the server is: `version()`, the cluster's `system_identifier` (the same on a primary and its
 * physical standbys, different on any other cluster) and the timeline of its last checkpoint (it
 * goes up at each promotion, once the next checkpoint has run). What this user may not read is
 * reported as unknown; an engine without the control functions gets its version only.
 */
async function serverCheck(executor: LockExecutor): Promise<DoctorCheck> {
  let row: Record<string, unknown>;
  try {
    row = await executor.transaction(async ({ query }) => (await query(SERVER_IDENTITY))[0] ?? {});
  } catch {
    row = await executor.transaction(async ({ query }) => (await query(SERVER_VERSION))[0] ?? {});
  }
  const known = (value: unknown, why: string) =>
    value === null || value === undefined ? `unknown (${why})` : String(value);
  return {
    id: 'server',
    level: 'ok',
    message: `${String(row.version ?? 'unknown version')}; system identifier ${known(row.system_identifier, 'pg_control_system() not readable by this user')}; timeline ${known(row.timeline, 'pg_control_checkpoint() not readable by this user')} (as of the last checkpoint).`,
  };
}

/** The engine self-test lock clients run on first use, as a check: FAIL names what it saw. */
async function engineCheck(executor: LockExecutor): Promise<DoctorCheck> {
  const id = 'engine-self-test';
  let result: EngineSelfTestResult;
  try {
    result = await runEngineSelfTest(executor);
  } catch (error) {
    return {
      id,
      level: 'warn',
      message: `The engine self-test could not run (${error instanceof Error ? error.message : String(error)}): lock clients will try it again on their first lock.`,
    };
  }
  if (!result.real)
    return {
      id,
      level: 'fail',
      message: `Advisory locks are not real on this server: ${result.found}. Every caller would get every lock at once; lock clients refuse it with ENGINE_LOCKS_NOT_REAL.`,
    };
  return {
    id,
    level: result.method === 'two-sessions' ? 'ok' : 'warn',
    message:
      result.method === 'two-sessions'
        ? `Advisory locks are real: ${result.found} (${Math.round(result.elapsedMs)} ms).`
        : `Advisory locks are held, but only one session could be checked: ${result.found}. A router that splits sessions would not show here; run doctor with a pool of two connections or more.`,
  };
}

/**
 * Runs every check against the server behind `executor`. Never throws for a failed check; each
 * outcome says what it found and what to do.
 */
export async function doctor(
  executor: LockExecutor,
  options: DoctorOptions = {},
): Promise<DoctorCheck[]> {
  assertLockExecutor(executor);
  const now = options.now ?? Date.now;
  const sentAt = now();
  const [facts, capacity] = await executor.transaction(async ({ query }) => [
    (await query(SERVER_FACTS))[0] ?? {},
    (await query(LOCK_TABLE_CAPACITY))[0] ?? {},
  ]);
  const receivedAt = now();
  const checks: DoctorCheck[] = [await serverCheck(executor), await engineCheck(executor)];
  checks.push(
    facts.standby === true
      ? {
          id: 'standby',
          level: 'fail',
          message:
            'The server is a standby (in recovery). Advisory locks must be taken on the primary: a standby cannot grant them to writers, and each standby has its own lock table. Point lockkit at the primary.',
        }
      : { id: 'standby', level: 'ok', message: 'The server is a primary.' },
  );
  const pooler = await poolerCheck(executor, options.driverBackendPid, Number(facts.pid));
  if (pooler) checks.push(pooler);
  const idle = ms(facts.idle_in_transaction_session_timeout);
  checks.push(
    idle > 0
      ? {
          id: 'idle-in-transaction-timeout',
          level: 'warn',
          message: `idle_in_transaction_session_timeout is ${facts.idle_in_transaction_session_timeout}: a transaction-scoped lock whose task pauses longer loses its connection and lock. Use leases for long jobs.`,
        }
      : {
          id: 'idle-in-transaction-timeout',
          level: 'ok',
          message: 'idle_in_transaction_session_timeout is off.',
        },
  );
  const statement = ms(facts.statement_timeout);
  checks.push(
    statement > 0
      ? {
          id: 'statement-timeout',
          level: 'warn',
          message: `statement_timeout is ${facts.statement_timeout}: blocking lock waits and long statements inside a locked task are cut at that point.`,
        }
      : { id: 'statement-timeout', level: 'ok', message: 'statement_timeout is off.' },
  );
  checks.push(keepaliveCheck(facts.tcp_keepalives_idle, facts.tcp_keepalives_idle_configured));
  if (facts.default_transaction_read_only === 'on') {
    checks.push({
      id: 'read-only',
      level: 'fail',
      message: 'default_transaction_read_only is on: lease and ledger writes will fail.',
    });
  }
  const slots = Number(capacity.slots ?? 0);
  const used = Number(capacity.used ?? 0);
  const ratio = slots > 0 ? used / slots : 0;
  checks.push(
    ratio > (options.lockTableWarnAbove ?? 0.8)
      ? {
          id: 'lock-table',
          level: 'warn',
          message: `The lock table is ${Math.round(ratio * 100)}% full (${used} of ${slots} slots): past 100% every lock fails with "out of shared memory". Release locks sooner or raise max_locks_per_transaction (needs a restart).`,
        }
      : {
          id: 'lock-table',
          level: 'ok',
          message: `The lock table has headroom: ${used} of ${slots} slots in use.`,
        },
  );
  const skew = Number(facts.now_ms) - (sentAt + receivedAt) / 2;
  const clockWarnMs = options.clockWarnMs ?? 500;
  checks.push(
    Math.abs(skew) > clockWarnMs
      ? {
          id: 'clock',
          level: 'warn',
          message: `This host's clock is ${Math.round(-skew)} ms off the database's. Leases use the database clock and are safe; the scheduler fires ticks by this clock, so keep skew below catchUpGraceMs (and the tick interval).`,
        }
      : {
          id: 'clock',
          level: 'ok',
          message: `This host's clock is within ${Math.max(1, Math.round(Math.abs(skew)))} ms of the database's.`,
        },
  );
  checks.push(await scheduleConflictCheck(executor, options.schema ?? DEFAULT_SCHEMA));
  return checks;
}

/** Jobs that live scheduler instances registered under different schedules. */
async function scheduleConflictCheck(executor: LockExecutor, schema: string): Promise<DoctorCheck> {
  const id = 'schedule-conflict';
  const rows = await executor.transaction(async ({ query }) => {
    const [table] = await query(SCHEDULES_TABLE_PRESENT, [schema]);
    if (table?.present !== true) return [];
    const s = conflictingSchedulesStatement(quoteIdentifier(schema), REGISTRATION_LIVE_MS);
    return query(s.text, s.params);
  });
  if (rows.length === 0)
    return {
      id,
      level: 'ok',
      message: `No job in schema "${schema}" is registered under two schedules by live schedulers.`,
    };
  const jobs = rows.map(
    (r) =>
      `${r.namespace ? `${String(r.namespace)}/` : ''}${String(r.job)}: ${String(r.schedules)}`,
  );
  return {
    id,
    level: 'warn',
    message: `Live schedulers registered these jobs under different schedules (each instance fires its own; catch-up judges each row by its own schedule): ${jobs.join(' | ')}. Deploy one schedule per job name, or give the applications different namespaces.`,
  };
}
