/**
 * The statements of leases. Every statement names the lease by (namespace, job key) and every
 * write after the claim is conditioned on the holder's fencing token, so a stale holder can never
 * overwrite a newer holder's row. Times always come from the database clock (`now()`).
 */
import type { Statement } from './locks.js';

/** Longest error message stored in `last_error`. */
export const MAX_ERROR_LENGTH = 2000;

/**
 * Claims the lease when it is free (no row, finished) or expired, bumping the fencing token, in
 * the transaction that holds the job's advisory lock. One row when claimed: `token` (text, an
 * int8), `expires_at`, `db_now`, `took_over` (the previous holder had expired while in progress).
 * No row when another holder's lease is still valid.
 * Params: $1 namespace, $2 job key, $3 owner, $4 ttl in ms.
 */
export function claimStatement(
  schema: string,
  namespace: string,
  jobKey: string,
  owner: string,
  ttlMs: number,
): Statement {
  return {
    // The CTE reads the row as it was before this statement (same snapshot), which RETURNING
    // cannot see; the job's advisory lock already serialises claims.
    text: `WITH previous AS MATERIALIZED (
             SELECT status FROM ${schema}.leases WHERE namespace = $1 AND job_key = $2
           )
           INSERT INTO ${schema}.leases AS l
                  (namespace, job_key, token, status, owner, claimed_at, heartbeat_at, expires_at, attempts)
           VALUES ($1, $2, 1, 'IN_PROGRESS', $3, now(), now(), now() + $4::float8 * interval '1 millisecond', 1)
           ON CONFLICT (namespace, job_key) DO UPDATE
              SET token = l.token + 1, status = 'IN_PROGRESS', owner = excluded.owner,
                  claimed_at = now(), heartbeat_at = now(), expires_at = excluded.expires_at,
                  finished_at = NULL, attempts = l.attempts + 1
            WHERE l.status <> 'IN_PROGRESS' OR l.expires_at <= now()
           RETURNING l.token::text AS token, l.expires_at, now() AS db_now,
                     coalesce((SELECT status = 'IN_PROGRESS' FROM previous), false) AS took_over`,
    params: [namespace, jobKey, owner, ttlMs],
  };
}

/** The current row of a lease, for telling a skipped claimer who holds it. */
export function readLeaseStatement(schema: string, namespace: string, jobKey: string): Statement {
  return {
    text: `SELECT token::text AS token, status, owner, expires_at, expires_at > now() AS valid
             FROM ${schema}.leases WHERE namespace = $1 AND job_key = $2`,
    params: [namespace, jobKey],
  };
}

/**
 * Extends the lease by `ttlMs` from the database's now, only for the holder of `token`: one row
 * (`expires_at`) when renewed, none when the lease was lost.
 */
export function renewStatement(
  schema: string,
  namespace: string,
  jobKey: string,
  token: bigint,
  ttlMs: number,
): Statement {
  return {
    text: `UPDATE ${schema}.leases
              SET expires_at = now() + $4::float8 * interval '1 millisecond', heartbeat_at = now()
            WHERE namespace = $1 AND job_key = $2 AND token = $3::int8
              AND status = 'IN_PROGRESS' AND expires_at > now()
           RETURNING expires_at`,
    params: [namespace, jobKey, String(token), ttlMs],
  };
}

/**
 * Records the end of the holder's run (COMPLETED, or FAILED with its error), only under its own
 * token and while its lease is still valid: one row when recorded, none when the lease was lost.
 */
export function finishStatement(
  schema: string,
  namespace: string,
  jobKey: string,
  token: bigint,
  outcome: { readonly failed: false } | { readonly failed: true; readonly error: string },
): Statement {
  return {
    text: `UPDATE ${schema}.leases
              SET status = $4, finished_at = now(), expires_at = now(), last_error = $5
            WHERE namespace = $1 AND job_key = $2 AND token = $3::int8
              AND status = 'IN_PROGRESS' AND expires_at > now()
           RETURNING finished_at`,
    params: [
      namespace,
      jobKey,
      String(token),
      outcome.failed ? 'FAILED' : 'COMPLETED',
      outcome.failed ? outcome.error.slice(0, MAX_ERROR_LENGTH) : null,
    ],
  };
}

/**
 * The fencing check for a downstream write, run inside the writer's transaction: one row when
 * `token` still holds a valid lease. `FOR SHARE` keeps a new claim (an UPDATE of this row) from
 * committing until the writer's transaction ends, so the write either lands under a valid lease
 * or is refused.
 */
export function fenceStatement(
  schema: string,
  namespace: string,
  jobKey: string,
  token: bigint,
): Statement {
  return {
    text: `SELECT 1 AS valid FROM ${schema}.leases
            WHERE namespace = $1 AND job_key = $2 AND token = $3::int8
              AND status = 'IN_PROGRESS' AND expires_at > now()
            FOR SHARE`,
    params: [namespace, jobKey, String(token)],
  };
}
