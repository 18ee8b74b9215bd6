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
 * A cheap look at the advisory locks held or awaited right now, for sampling many times a second
 * (a transaction lock often lives for milliseconds): no blocking graph, no timings.
 */
export const ADVISORY_LOCK_SAMPLE = `
  SELECT l.pid, l.classid::int8 AS classid, l.objid::int8 AS objid, l.objsubid::int AS objsubid,
         l.mode, l.granted, a.application_name, host(a.client_addr) AS client_addr,
         a.usename AS user_name
    FROM pg_locks l
    LEFT JOIN pg_stat_activity a ON a.pid = l.pid
   WHERE l.locktype = 'advisory'
     AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())`;

/**
 * The shared lock table: its slots (`max_locks_per_transaction × (max_connections +
 * max_prepared_transactions)`) and the entries in use (fast-path locks live elsewhere).
 */
export const LOCK_TABLE_CAPACITY = `
  SELECT current_setting('max_locks_per_transaction')::int8
           * (current_setting('max_connections')::int8 + current_setting('max_prepared_transactions')::int8) AS slots,
         (SELECT count(*) FROM pg_locks WHERE NOT fastpath)::int8 AS used,
         (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory')::int8 AS advisory`;

/**
 * Whether lockkit's tables exist in `schema` (unquoted name): `leases` and `runs` booleans. A
 * catalog scan, not to_regclass(): a missing name looked up through the catalog caches stays
 * cached as missing in the backend, which a later migrate() on the same pooled connection would
 * trip over (see sql/migrations.ts).
 */
export function tablesStatement(schemaName: string): Statement {
  return {
    text: `SELECT coalesce(bool_or(c.relname = 'leases'), false) AS leases,
                  coalesce(bool_or(c.relname = 'runs'), false) AS runs
             FROM pg_catalog.pg_class c
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
            WHERE n.nspname = $1::text AND c.relname IN ('leases', 'runs')`,
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

/**
 * The ledger's job names, one index probe each: a loose scan of the `(job, tick)` primary key, so
 * that listing the jobs costs as many probes as there are jobs, not a scan of the ledger.
 */
function jobNames(schema: string): string {
  return `WITH RECURSIVE names AS (
            (SELECT job FROM ${schema}.runs ORDER BY job LIMIT 1)
            UNION ALL
            SELECT (SELECT r.job FROM ${schema}.runs r WHERE r.job > n.job ORDER BY r.job LIMIT 1)
              FROM names n WHERE n.job IS NOT NULL
          )`;
}

/**
 * Per scheduled job, over its latest `$1` ledger rows only (a backward range of the primary key):
 * its last tick, last success, and counts by status. Bounded by jobs × window, whatever the
 * ledger's length.
 */
export function jobsStatement(schema: string, window: number): Statement {
  return {
    text: `${jobNames(schema)}
          SELECT n.job, w.last_tick, w.last_success, w.succeeded, w.failed, w.missed,
                 w.skipped_overlap, w.abandoned, w.running, w.total
            FROM names n
            CROSS JOIN LATERAL (
              SELECT max(tick) AS last_tick,
                     max(tick) FILTER (WHERE status = 'SUCCEEDED') AS last_success,
                     count(*) FILTER (WHERE status = 'SUCCEEDED')::int8 AS succeeded,
                     count(*) FILTER (WHERE status = 'FAILED')::int8 AS failed,
                     count(*) FILTER (WHERE status = 'MISSED')::int8 AS missed,
                     count(*) FILTER (WHERE status = 'SKIPPED_OVERLAP')::int8 AS skipped_overlap,
                     count(*) FILTER (WHERE status = 'ABANDONED')::int8 AS abandoned,
                     count(*) FILTER (WHERE status = 'RUNNING')::int8 AS running,
                     count(*)::int8 AS total
                FROM (SELECT tick, status FROM ${schema}.runs r
                       WHERE r.job = n.job ORDER BY r.tick DESC LIMIT $1) latest
            ) w
           WHERE n.job IS NOT NULL
           ORDER BY n.job`,
    params: [window],
  };
}

/**
 * The latest ledger rows, newest first: each job's newest `$2`, and the newest `$3` over all jobs
 * ($1 = the larger of the two). Read per job from the primary key — jobs × $1 index entries at
 * most — never by sorting the whole ledger. `job_rank` 1 is a job's newest row.
 */
export function latestRunsStatement(schema: string, perJob: number, overall: number): Statement {
  return {
    text: `${jobNames(schema)},
          latest AS (
            SELECT r.*, row_number() OVER (PARTITION BY r.job ORDER BY r.tick DESC) AS job_rank
              FROM names n
              CROSS JOIN LATERAL (SELECT * FROM ${schema}.runs r
                                   WHERE r.job = n.job ORDER BY r.tick DESC LIMIT $1) r
             WHERE n.job IS NOT NULL
          ),
          ranked AS (
            SELECT l.*, row_number() OVER (ORDER BY l.tick DESC, l.job) AS overall_rank FROM latest l
          )
          SELECT job, tick, status, owner, attempt, token::text AS token, started_at, finished_at,
                 error, job_rank, overall_rank
            FROM ranked
           WHERE job_rank <= $2 OR overall_rank <= $3
           ORDER BY tick DESC, job`,
    params: [Math.max(perJob, overall), perJob, overall],
  };
}

/**
 * What `doctor` reads about the server in one round trip. `tcp_keepalives_idle` reads, on a TCP
 * connection, as the socket's real value (the OS default when the setting is 0), in seconds; its
 * `reset_val` says whether it was set at all.
 */
export const SERVER_FACTS = `
  SELECT pg_catalog.pg_is_in_recovery() AS standby, pg_backend_pid() AS pid,
         (extract(epoch FROM clock_timestamp()) * 1000)::float8 AS now_ms,
         current_setting('server_version') AS version,
         current_setting('idle_in_transaction_session_timeout') AS idle_in_transaction_session_timeout,
         current_setting('statement_timeout') AS statement_timeout,
         current_setting('lock_timeout') AS lock_timeout,
         current_setting('tcp_keepalives_idle') AS tcp_keepalives_idle,
         (SELECT reset_val FROM pg_settings WHERE name = 'tcp_keepalives_idle') AS tcp_keepalives_idle_configured,
         current_setting('default_transaction_read_only') AS default_transaction_read_only`;
