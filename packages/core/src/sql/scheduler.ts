/**
 * The statements of the scheduler's ledger (`<schema>.runs`), one row per (job, scheduled tick).
 * The primary key is what makes a tick run at most once, whichever node claims it and whatever
 * its clock says; every claim runs while holding the job's advisory lock.
 */
import { MAX_ERROR_LENGTH } from './leases.js';
import type { Statement } from './locks.js';

/** The ledger row of one tick: `status`, `attempt`, `token` — or none. */
export function tickStatement(schema: string, job: string, tick: Date): Statement {
  return {
    text: `SELECT status, attempt, token::text AS token FROM ${schema}.runs WHERE job = $1 AND tick = $2`,
    params: [job, tick.toISOString()],
  };
}

/**
 * The job's `limit` latest ticks in the ledger at or before `horizon` (`tick`, newest first): the
 * settled part of its history that catch-up looks for holes in. A tick every node failed to run
 * has no row, yet later ticks may already have theirs; reading a window of rows below the horizon,
 * rather than only the newest row, keeps such a hole in view until it is old enough to judge.
 */
export function recentTicksStatement(
  schema: string,
  job: string,
  horizon: Date,
  limit: number,
): Statement {
  return {
    text: `SELECT tick FROM ${schema}.runs WHERE job = $1 AND tick <= $2 ORDER BY tick DESC LIMIT $3::int4`,
    params: [job, horizon.toISOString(), limit],
  };
}

/**
 * Claims a tick: inserts it RUNNING, or takes a FAILED row for another attempt (`retry`).
 * One row (`attempt`) when claimed; none when the tick is already someone's.
 */
export function claimTickStatement(
  schema: string,
  job: string,
  tick: Date,
  owner: string,
  token: bigint | null,
  maxAttempts: number,
): Statement {
  return {
    text: `INSERT INTO ${schema}.runs AS r (job, tick, status, owner, attempt, token, started_at)
           VALUES ($1, $2, 'RUNNING', $3, 1, $4::int8, now())
           ON CONFLICT (job, tick) DO UPDATE
              SET status = 'RUNNING', owner = excluded.owner, attempt = r.attempt + 1,
                  token = excluded.token, started_at = now(), finished_at = NULL, error = NULL
            WHERE r.status = 'FAILED' AND r.attempt < $5::int4
           RETURNING attempt`,
    params: [job, tick.toISOString(), owner, token === null ? null : String(token), maxAttempts],
  };
}

/**
 * Records a tick that will not run (`SKIPPED_OVERLAP`, `MISSED`), unless it already has a row.
 * One row when recorded.
 */
export function recordTickStatement(
  schema: string,
  job: string,
  tick: Date,
  status: 'SKIPPED_OVERLAP' | 'MISSED',
  owner: string,
): Statement {
  return {
    text: `INSERT INTO ${schema}.runs (job, tick, status, owner, finished_at)
           VALUES ($1, $2, $3, $4, now())
           ON CONFLICT (job, tick) DO NOTHING RETURNING tick`,
    params: [job, tick.toISOString(), status, owner],
  };
}

/**
 * Ends a claimed tick: SUCCEEDED, or FAILED with its error. In lease mode only under the run's own
 * fencing token (`token`), so a stale holder cannot rewrite it. One row when recorded.
 */
export function finishTickStatement(
  schema: string,
  job: string,
  tick: Date,
  token: bigint | null,
  outcome: { readonly failed: false } | { readonly failed: true; readonly error: string },
): Statement {
  return {
    text: `UPDATE ${schema}.runs
              SET status = $3, finished_at = now(), error = $4
            WHERE job = $1 AND tick = $2 AND status = 'RUNNING'
              AND ($5::int8 IS NULL OR token = $5::int8)
           RETURNING tick`,
    params: [
      job,
      tick.toISOString(),
      outcome.failed ? 'FAILED' : 'SUCCEEDED',
      outcome.failed ? outcome.error.slice(0, MAX_ERROR_LENGTH) : null,
      token === null ? null : String(token),
    ],
  };
}

/**
 * Marks RUNNING rows of lease-mode runs whose lease token is no longer the live one as
 * ABANDONED (their holder died or lost the lease): the rows `tick`, `attempt` it marked.
 */
export function abandonStatement(schema: string, job: string, liveToken: bigint): Statement {
  return {
    text: `UPDATE ${schema}.runs SET status = 'ABANDONED', finished_at = now(),
                  error = 'lease lost: the run did not finish under its fencing token'
            WHERE job = $1 AND status = 'RUNNING' AND token IS NOT NULL AND token < $2::int8
           RETURNING tick, attempt`,
    params: [job, String(liveToken)],
  };
}

/** Deletes ledger rows older than `retentionMs`, always keeping the job's latest row. */
export function pruneStatement(schema: string, job: string, retentionMs: number): Statement {
  return {
    text: `DELETE FROM ${schema}.runs
            WHERE job = $1 AND tick < now() - $2::float8 * interval '1 millisecond'
              AND status <> 'RUNNING'
              AND tick < (SELECT max(tick) FROM ${schema}.runs WHERE job = $1)`,
    params: [job, retentionMs],
  };
}

/** Savepoint statements that let a failed transaction-mode run record its failure with its claim. */
export const SAVEPOINT = 'SAVEPOINT lockkit_run';
/** See {@link SAVEPOINT}. */
export const ROLLBACK_TO_SAVEPOINT = 'ROLLBACK TO SAVEPOINT lockkit_run';
/** See {@link SAVEPOINT}. */
export const RELEASE_SAVEPOINT = 'RELEASE SAVEPOINT lockkit_run';
