/**
 * The statements of leases. Every statement names the lease by (namespace, job key) and every
 * write after the claim is conditioned on the holder's fencing token, so a stale holder can never
 * overwrite a newer holder's row.
 *
 * Time is the database's `clock_timestamp()` at the moment of each check and write — never
 * `now()`, which is the transaction's start and can lie far behind a statement that ran late.
 *
 * Who waits for whom. The row-lock modes are chosen so that nothing a holder does queues behind a
 * rival, and no claim ever queues behind anyone:
 * - A claim (under the job's exclusive advisory try-lock, which serialises claimers) locks the row
 *   `FOR UPDATE SKIP LOCKED`, and only when the row is free or expired. A claim that finds the
 *   lease valid takes no row lock at all; one that finds the row locked skips it and reports the
 *   holder. A brand-new row is inserted `ON CONFLICT DO NOTHING`.
 * - A renewal and the finish are plain UPDATEs of non-key columns: `FOR NO KEY UPDATE`, which
 *   conflicts with a claim's `FOR UPDATE` (only ever taken on an expired lease) but not with a
 *   fence's `FOR KEY SHARE`.
 * - A fence (a fenced write's check) locks the row `FOR KEY SHARE SKIP LOCKED`: while it is held,
 *   claims skip the row, so no takeover can commit under an open fenced write, while the holder's
 *   renewals go on. It never waits: a row locked by a claim means a takeover of an expired lease,
 *   and the fence is refused.
 * This holds only while no statement here changes a key column (namespace, job_key) and no unique
 * index covers a column a renewal or finish writes: either would turn those UPDATEs into
 * `FOR UPDATE`, which conflicts with a fence.
 *
 * On a hot standby the claim, renewal, finish and fence are each refused before any of their
 * expressions is evaluated: every one writes or locks a row, which a read-only transaction refuses
 * at executor start (SQLSTATE 25006). So the claim's `pg_current_wal_lsn()`, which would raise
 * 55000 in recovery, is never reached there, and a `pg_is_in_recovery()` column could never be
 * seen true (`test/lease-failover.test.ts` runs all four on a standby).
 */
import { type Statement, TRANSACTION_ID, TRANSACTION_STARTED } from './locks.js';

/** Longest error message stored in `last_error`. */
export const MAX_ERROR_LENGTH = 2000;

/**
 * The layout of a fencing token, one positive int8 that orders as a number: from the top, the
 * generation (7 bits), the WAL timeline the token was issued on ({@link TOKEN_TIMELINE_BITS}) and
 * the claims counted on that timeline ({@link TOKEN_SEQUENCE_BITS}). A claim on the timeline the
 * previous token was issued on adds one. A claim on a higher timeline — the server was promoted
 * (or recovered to a point in time) since — starts that timeline's count at 0, above every token
 * of the lower timelines; a standby is always promoted onto a timeline higher than any it
 * follows, so a claim after a failover exceeds every token the old primary issued, even in a
 * commit the standby never received. A claim on a *lower* timeline than the previous token's —
 * the tables were restored, upgraded with pg_upgrade (which restarts at timeline 1) or copied to
 * another cluster — raises the generation, so tokens still grow. Rows carry no cluster identity,
 * so one gap stays: a standby promoted onto the restored row's timeline or above, which never
 * received any claim of that job made since the restore, takes the row for its own cluster's.
 */
export const TOKEN_SEQUENCE_BITS = 36;
/** How many bits of a fencing token, above the sequence, hold the timeline; see {@link TOKEN_SEQUENCE_BITS}. */
export const TOKEN_TIMELINE_BITS = 20;
const TIMELINE_MASK = 2 ** TOKEN_TIMELINE_BITS - 1;
const GENERATION_SHIFT = TOKEN_SEQUENCE_BITS + TOKEN_TIMELINE_BITS;
/** The largest generation a token can hold (7 bits, the int8's sign bit left clear). */
const MAX_GENERATION = 127;

/**
 * The timeline this server writes WAL on now, from its current WAL insert position (the first 8
 * hex digits of the WAL file name). Not `pg_control_checkpoint().timeline_id`: that still names
 * the old timeline after a promotion, until the next checkpoint completes. Past the largest
 * timeline a token can hold, every timeline counts as that one (tokens still grow, by one).
 */
const CURRENT_TIMELINE = `LEAST(('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int8, ${TIMELINE_MASK})`;

/**
 * Where a claim reads its epoch: `'wal'`, the server's current WAL timeline (above); `'none'`, on
 * an engine that does not expose its WAL position to SQL (Aurora PostgreSQL answers
 * `pg_current_wal_lsn()` with "not supported"), the timeline of the row's own token, so tokens
 * count up by one with no epoch of their own. See {@link TIMELINE_PROBE_STATEMENT}.
 */
export type TimelineSource = 'wal' | 'none';

/**
 * Asks whether this server exposes its WAL timeline to SQL: one row, `timeline`, when it does.
 * Raises on a standby (55000) and on engines that do not support the functions (0A000), or when
 * the role may not call them (42501).
 */
export const TIMELINE_PROBE_STATEMENT = `SELECT ${CURRENT_TIMELINE} AS timeline`;

/**
 * The token a claim issues after `previous` (an int8 expression) on timeline `timeline` (an int8
 * expression). @internal
 */
export function nextToken(previous: string, timeline: string): string {
  const issuedOn = `((${previous} >> ${TOKEN_SEQUENCE_BITS}) & ${TIMELINE_MASK})`;
  // The generation has 7 bits: at 127, a claim on a lower timeline just counts up by one (a
  // higher generation would overflow int8 into negative tokens).
  return `(CASE WHEN ${issuedOn} = ${timeline} THEN ${previous} + 1
                 WHEN ${issuedOn} > ${timeline} AND (${previous} >> ${GENERATION_SHIFT}) >= ${MAX_GENERATION} THEN ${previous} + 1
                 ELSE (((${previous} >> ${GENERATION_SHIFT}) + (${issuedOn} > ${timeline})::int) << ${GENERATION_SHIFT})
                      | (${timeline} << ${TOKEN_SEQUENCE_BITS}) END)`;
}

/** `clock_timestamp()` plus `$4` milliseconds. */
const EXPIRY = `clock_timestamp() + $4::float8 * interval '1 millisecond'`;

/**
 * Claims the lease when it is free (no row, finished) or expired, in one statement run in the
 * transaction that holds the job's advisory lock, with a new fencing token (see
 * {@link TOKEN_SEQUENCE_BITS}). It never waits on a row (see the module comment). Always one row:
 * - claimed: `claimed` true, `token` (text, an int8), `expires_at`, `took_over` (the previous
 *   holder had expired while in progress);
 * - not claimed: `claimed` false and the row as it stood (`token`, `status`, `owner`,
 *   `expires_at`; all null when there is no row), read without locking.
 * Params: $1 namespace, $2 job key, $3 owner, $4 ttl in ms.
 */
export function claimStatement(
  schema: string,
  namespace: string,
  jobKey: string,
  owner: string,
  ttlMs: number,
  timeline: TimelineSource = 'wal',
): Statement {
  const currentTimeline =
    timeline === 'wal'
      ? CURRENT_TIMELINE
      : `COALESCE((SELECT (token >> ${TOKEN_SEQUENCE_BITS}) & ${TIMELINE_MASK} FROM current), 0)`;
  return {
    // `current` is the row as this statement's snapshot sees it, unlocked. `target` is the same
    // row only if it is claimable *and* nobody holds a lock on it: a renewal or finish in flight
    // (the holder is alive) or a fence (a fenced write is open) makes the claim skip it. Under
    // READ COMMITTED, FOR UPDATE re-checks the newest committed version, so a renewal that
    // committed after the snapshot is seen. Exactly one of `taken`, `created` or the fallback row
    // comes back.
    text: `WITH current AS MATERIALIZED (
             SELECT token, status, owner, expires_at FROM ${schema}.leases
              WHERE namespace = $1 AND job_key = $2
           ),
           timeline AS MATERIALIZED (SELECT ${currentTimeline} AS id),
           target AS MATERIALIZED (
             SELECT status FROM ${schema}.leases
              WHERE namespace = $1 AND job_key = $2
                AND (status <> 'IN_PROGRESS' OR expires_at <= clock_timestamp())
              FOR UPDATE SKIP LOCKED
           ),
           taken AS (
             UPDATE ${schema}.leases AS l
                SET token = ${nextToken('l.token', '(SELECT id FROM timeline)')}, status = 'IN_PROGRESS', owner = $3,
                    claimed_at = clock_timestamp(), heartbeat_at = clock_timestamp(),
                    expires_at = ${EXPIRY}, finished_at = NULL, attempts = l.attempts + 1
              WHERE l.namespace = $1 AND l.job_key = $2 AND EXISTS (SELECT 1 FROM target)
             RETURNING l.token, l.expires_at,
                       (SELECT t.status = 'IN_PROGRESS' FROM target t) AS took_over
           ),
           created AS (
             INSERT INTO ${schema}.leases AS l
                    (namespace, job_key, token, status, owner, claimed_at, heartbeat_at, expires_at, attempts)
             SELECT $1, $2, ${nextToken('0::int8', '(SELECT id FROM timeline)')}, 'IN_PROGRESS', $3, clock_timestamp(), clock_timestamp(), ${EXPIRY}, 1
              WHERE NOT EXISTS (SELECT 1 FROM current)
             ON CONFLICT (namespace, job_key) DO NOTHING
             RETURNING l.token, l.expires_at, false AS took_over
           )
           SELECT true AS claimed, token::text AS token, expires_at, took_over,
                  NULL::text AS status, NULL::text AS owner FROM taken
           UNION ALL
           SELECT true, token::text, expires_at, took_over, NULL, NULL FROM created
           UNION ALL
           SELECT false, c.token::text, c.expires_at, false, c.status, c.owner
             FROM (SELECT 1) AS one LEFT JOIN current c ON true
            WHERE NOT EXISTS (SELECT 1 FROM taken) AND NOT EXISTS (SELECT 1 FROM created)`,
    params: [namespace, jobKey, owner, ttlMs],
  };
}

/** The current row of a lease, read without locking, for telling a skipped claimer who holds it. */
export function readLeaseStatement(schema: string, namespace: string, jobKey: string): Statement {
  return {
    text: `SELECT token::text AS token, status, owner, expires_at
             FROM ${schema}.leases WHERE namespace = $1 AND job_key = $2`,
    params: [namespace, jobKey],
  };
}

/**
 * Extends the lease to `ttlMs` from the moment of the write, only for the holder of `token` and
 * only while the lease is still valid: one row (`expires_at`) when renewed, none when the lease was
 * lost. A plain UPDATE of non-key columns: it does not wait on fences, and a claim never holds a
 * lock on a valid lease, so contenders cannot hold it up.
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
              SET expires_at = ${EXPIRY}, heartbeat_at = clock_timestamp()
            WHERE namespace = $1 AND job_key = $2 AND token = $3::int8
              AND status = 'IN_PROGRESS' AND expires_at > clock_timestamp()
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
              SET status = $4, finished_at = clock_timestamp(), expires_at = clock_timestamp(),
                  last_error = $5
            WHERE namespace = $1 AND job_key = $2 AND token = $3::int8
              AND status = 'IN_PROGRESS' AND expires_at > clock_timestamp()
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
 * The fencing check for a downstream write, run first inside the writer's transaction: one row
 * when `token` still holds a valid lease, none otherwise. `FOR KEY SHARE` keeps any claim from
 * taking the row over until the writer's transaction ends — so a write either lands while its
 * token holds the lease or is refused — without blocking the holder's renewals. `SKIP LOCKED`:
 * the only lock it can meet is a claim's, on an expired lease, and then the answer is no. `began`
 * lets the fenced write tell, before COMMIT, that its task did not end the transaction (and the
 * row lock with it).
 */
export function fenceStatement(
  schema: string,
  namespace: string,
  jobKey: string,
  token: bigint,
): Statement {
  return {
    text: `SELECT 1 AS valid, ${TRANSACTION_STARTED}, ${TRANSACTION_ID} FROM ${schema}.leases
            WHERE namespace = $1 AND job_key = $2 AND token = $3::int8
              AND status = 'IN_PROGRESS' AND expires_at > clock_timestamp()
            FOR KEY SHARE SKIP LOCKED`,
    params: [namespace, jobKey, String(token)],
  };
}
