/**
 * The statements of inspection: what is locked, by whom, who waits, how full the lock table is,
 * and what the lease and ledger tables say. Read-only.
 */
import type { Statement } from './locks.js';

/** Every advisory lock held or awaited in the current database, with its backend's activity. */
export const ADVISORY_LOCKS = `
  SELECT l.pid, l.classid::int8 AS classid, l.objid::int8 AS objid, l.objsubid::int AS objsubid,
         l.mode, l.granted, a.application_name, host(a.client_addr) AS client_addr, a.state,
         a.usename AS user_name,
         (extract(epoch FROM now() - a.xact_start) * 1000)::float8 AS transaction_age_ms,
         CASE WHEN NOT l.granted THEN (extract(epoch FROM now() - a.query_start) * 1000)::float8 END AS waiting_ms,
         pg_blocking_pids(l.pid) AS blocked_by
    FROM pg_locks l
    LEFT JOIN pg_stat_activity a ON a.pid = l.pid
   WHERE l.locktype = 'advisory'
     AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
   ORDER BY l.granted DESC, l.pid`;

/**
 * The shared lock table: its slots (`max_locks_per_transaction × (max_connections +
 * max_prepared_transactions)`) and the entries in use (fast-path locks live elsewhere).
 */
export const LOCK_TABLE_CAPACITY = `
  SELECT current_setting('max_locks_per_transaction')::int8
           * (current_setting('max_connections')::int8 + current_setting('max_prepared_transactions')::int8) AS slots,
         (SELECT count(*) FROM pg_locks WHERE NOT fastpath)::int8 AS used,
         (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory')::int8 AS advisory`;

/** Whether lockkit's tables exist in `schema` (unquoted name): `leases` and `runs` booleans. */
export function tablesStatement(schemaName: string): Statement {
  return {
    text: `SELECT to_regclass(format('%I.leases', $1::text)) IS NOT NULL AS leases,
                  to_regclass(format('%I.runs', $1::text)) IS NOT NULL AS runs`,
    params: [schemaName],
  };
}

/** Every lease with its state. */
export function leasesStatement(schema: string): string {
  return `SELECT namespace, job_key, token::text AS token, status, owner, claimed_at, heartbeat_at,
                 expires_at, finished_at, attempts::int8 AS attempts, last_error,
                 (status = 'IN_PROGRESS' AND expires_at > now()) AS held
            FROM ${schema}.leases ORDER BY namespace, job_key`;
}

/** Per scheduled job: its last run, last success, and counts of failures and missed ticks. */
export function jobsStatement(schema: string): string {
  return `SELECT job, max(tick) AS last_tick,
                 max(tick) FILTER (WHERE status = 'SUCCEEDED') AS last_success,
                 count(*) FILTER (WHERE status = 'FAILED')::int8 AS failed,
                 count(*) FILTER (WHERE status = 'MISSED')::int8 AS missed,
                 count(*) FILTER (WHERE status = 'SKIPPED_OVERLAP')::int8 AS skipped_overlap,
                 count(*) FILTER (WHERE status = 'ABANDONED')::int8 AS abandoned,
                 count(*) FILTER (WHERE status = 'RUNNING')::int8 AS running,
                 count(*)::int8 AS total
            FROM ${schema}.runs GROUP BY job ORDER BY job`;
}

/** The latest ledger rows, newest first: $1 the limit. */
export function recentRunsStatement(schema: string, limit: number): Statement {
  return {
    text: `SELECT job, tick, status, owner, attempt, token::text AS token, started_at, finished_at, error
             FROM ${schema}.runs ORDER BY tick DESC, job LIMIT $1`,
    params: [limit],
  };
}

/**
 * What `doctor` reads about the server in one round trip. `tcp_keepalives_idle` reads, on a TCP
 * connection, as the socket's real value (the OS default when the setting is 0), in seconds; its
 * `reset_val` says whether it was set at all.
 */
export const SERVER_FACTS = `
  SELECT pg_is_in_recovery() AS standby, pg_backend_pid() AS pid,
         (extract(epoch FROM clock_timestamp()) * 1000)::float8 AS now_ms,
         current_setting('server_version') AS version,
         current_setting('idle_in_transaction_session_timeout') AS idle_in_transaction_session_timeout,
         current_setting('statement_timeout') AS statement_timeout,
         current_setting('lock_timeout') AS lock_timeout,
         current_setting('tcp_keepalives_idle') AS tcp_keepalives_idle,
         (SELECT reset_val FROM pg_settings WHERE name = 'tcp_keepalives_idle') AS tcp_keepalives_idle_configured,
         current_setting('default_transaction_read_only') AS default_transaction_read_only`;
