/**
 * The statements of the scheduler's ledger (`<schema>.runs`), one row per (namespace, job,
 * scheduled tick), and of its registered schedules (`<schema>.schedules`). The primary key is what
 * makes a tick run at most once, whichever node claims it and whatever its clock says; every claim
 * runs while holding the job's advisory lock. Instants of the scheduler's clock (`now`, `retry_at`)
 * are passed in, never read from the server: ticks are on the scheduler's clock too.
 *
 * Statements that record ticks take arrays, so that a whole tick's records are one statement.
 */
import type { LockKey } from '../keys.js';
import { MAX_ERROR_LENGTH } from './leases.js';
import { IN_RECOVERY, onPrimary, type Statement } from './locks.js';

/** Which scheduler's rows: the quoted schema and the ledger namespace ('' when none). */
export interface LedgerScope {
  readonly schema: string;
  readonly namespace: string;
}

const iso = (d: Date) => d.toISOString();

/**
 * The `retry_at` of a PENDING row that is due at once — a queued tick, a tick given back, a tick
 * held for catch-up — given the row's `tick` and the writing node's `now`: the tick's own time (or
 * `now`, for a tick fired before its time by hand). Not the writer's `now` alone: that instant is
 * on the writer's clock, and a reader whose clock runs behind found a tick queued by a node ahead
 * not yet due, at the end of the run it queued behind and even when its own timer fired that very
 * tick (skipped as "waiting"), leaving it to nobody. The tick's time is the same instant on every
 * clock: every node whose timer fires the tick finds it due. Only a retry is due later than that
 * (`retryDelayMs` after the failure, on the failing node's clock): a deliberate delay.
 */
const dueAtOnce = (tick: string, now: string) => `least(${tick}, ${now})`;
const tokenParam = (token: bigint | null) => (token === null ? null : String(token));

/**
 * The `status` {@link tickStateStatement} answers for a tick with no row that pruning may have
 * deleted (never stored).
 */
export const PRUNED = 'PRUNED';

/**
 * The ledger row of one tick, or none: `status`, `attempt`, `token`, `due` (a PENDING row whose
 * `retry_at` has come), and `runner_gone` (a lease-mode RUNNING row whose lease is no longer live
 * under its token: its runner died or lost it).
 *
 * With `prunedBeforeMs` (what this node's pruning keeps; null when it keeps every row), a tick with
 * no row that is older than that (by the database's clock, read now), while the job has rows after
 * it and none before it, answers `status` {@link PRUNED}: pruning deletes only a prefix of a job's
 * rows, never its latest, and only rows older than what it keeps (see `pruneStatement`), so such a
 * tick may have run and had its row deleted — nothing tells the two apart, and running it would
 * run it twice. A tick with an older row beside it was not pruned (a transaction-mode run of it
 * that outlasted the look-back and rolled back leaves exactly that: the tick is still to run).
 */
export function tickStateStatement(
  { schema, namespace }: LedgerScope,
  leaseNamespace: string,
  job: string,
  tick: Date,
  now: Date,
  prunedBeforeMs: number | null,
): Statement {
  return {
    text: `SELECT r.status, r.attempt, r.token::text AS token, r.error,
                  (r.status = 'PENDING' AND r.retry_at <= $4) AS due,
                  (r.status = 'RUNNING' AND r.token IS NOT NULL AND NOT EXISTS (
                     SELECT 1 FROM ${schema}.leases l
                      WHERE l.namespace = $5 AND l.job_key = r.job AND l.token = r.token
                        AND l.status = 'IN_PROGRESS' AND l.expires_at > now())) AS runner_gone
             FROM ${schema}.runs r WHERE r.namespace = $1 AND r.job = $2 AND r.tick = $3
           UNION ALL
           SELECT '${PRUNED}', NULL, NULL, NULL, false, false
            WHERE $3::timestamptz < clock_timestamp() - $6::float8 * interval '1 millisecond'
              AND NOT EXISTS (SELECT 1 FROM ${schema}.runs
                               WHERE namespace = $1 AND job = $2 AND tick <= $3)
              AND EXISTS (SELECT 1 FROM ${schema}.runs
                           WHERE namespace = $1 AND job = $2 AND tick > $3)`,
    params: [namespace, job, iso(tick), iso(now), leaseNamespace, prunedBeforeMs],
  };
}

/**
 * The judgement of a node whose wait for the job's lock timed out, in one statement. It tries the
 * tick's own lock first (`tick_free`; kept, when had, until the end of the transaction), and only
 * then — once no run of this tick can start meanwhile — looks in `pg_locks` for a transaction that
 * holds the job's lock together with ANOTHER tick's lock of the same scheduler namespace
 * (`another_tick_runs`, NULL when `tick_free` is not true). Only that is proof of an overlap: a
 * runner takes the job's lock, then its tick's lock, in two statements, so a transaction seen
 * holding the job's lock alone may be a run of this very tick between its two statements (or one
 * dying, whose tick lock Postgres freed a moment before its job lock).
 *
 * The holder is matched by `virtualtransaction`, which names one transaction, not by pid (a pooled
 * backend serves many clients); `pg_locks` is one consistent snapshot of the lock table, so both
 * locks are seen held at the same instant. The judge never takes the job's lock: a judge is then
 * never mistaken for a run. It costs a scan of the lock table, and is asked only after a timeout.
 * On a standby it takes nothing and reports {@link IN_RECOVERY}.
 */
export function tickJudgeStatement(jobKey: LockKey, tickKey: LockKey): Statement {
  const job = jobKey.pgLocks;
  const tick = tickKey.pgLocks;
  // Tick keys are pairs whose first number is the tick namespace's: a tick lock of the same
  // namespace shares `classid` and `objsubid` with this one and differs in `objid`.
  const tryTick = tickKey.pair
    ? { args: '$7::int4, $8::int4', params: [tickKey.pair[0], tickKey.pair[1]] }
    : { args: '$7::int8', params: [String(tickKey.int8)] };
  // The CASE evaluates tick_free before its subquery (an init plan, run on first use): the tick's
  // lock is ours, or known taken, before the snapshot is read.
  return {
    text: `WITH judge AS (
             SELECT ${onPrimary(`pg_try_advisory_xact_lock(${tryTick.args})`)} AS tick_free)
           SELECT judge.tick_free,
                  CASE WHEN judge.tick_free THEN EXISTS (
                    SELECT 1 FROM pg_catalog.pg_locks j
                      JOIN pg_catalog.pg_locks t ON t.virtualtransaction = j.virtualtransaction
                     WHERE j.locktype = 'advisory' AND j.granted
                       AND j.database = (SELECT d.oid FROM pg_catalog.pg_database d
                                          WHERE d.datname = pg_catalog.current_database())
                       AND j.classid::int8 = $1::int8 AND j.objid::int8 = $2::int8
                       AND j.objsubid = $3::int4
                       AND t.locktype = 'advisory' AND t.granted AND t.database = j.database
                       AND t.classid::int8 = $4::int8 AND t.objsubid = $6::int4
                       AND t.objid::int8 <> $5::int8) END AS another_tick_runs,
                  ${IN_RECOVERY}
             FROM judge`,
    params: [
      String(job.classid),
      String(job.objid),
      job.objsubid,
      String(tick.classid),
      String(tick.objid),
      tick.objsubid,
      ...tryTick.params,
    ],
  };
}

/**
 * The job's ledger ticks at or before `horizon` that catch-up reads, newest first: all of them from
 * its anchor on — the oldest of the latest `window` rows that are `anchoring`: written under the
 * schedule `hash` (or before hashes were recorded), neither SKIPPED_OVERLAP nor PENDING — and at
 * most `cap` (the anchor is looked for among the latest `cap` rows; with none there, the latest
 * `cap` rows are read and catch-up anchors on the oldest current one). Skipped and queued rows do
 * not anchor: they pile up, one a tick, while a transaction-mode run of an earlier tick lasts (its
 * claim is not committed, so that tick has no row), and if that run dies, the tick must still be in
 * view. (Queued ticks that run before any catch-up judges that tick anchor once they have run: the
 * run of a queued tick judges the ticks before it first; see the scheduler.)
 *
 * Each row also has `current` (its schedule is the job's) and `self_committed`: a committed
 * RUNNING row with no fencing token, which only a transaction-mode handler that ended the tick's
 * transaction itself leaves (the claim and its record otherwise commit together), when its node
 * did not record it FAILED (it died; it stopped while the database was away; or the handler's
 * COMMIT was followed by a lost connection, reported as such by some drivers).
 */
export function recentTicksStatement(
  { schema, namespace }: LedgerScope,
  job: string,
  horizon: Date,
  hash: string,
  window: number,
  cap: number,
): Statement {
  const current = '(schedule_hash IS NULL OR schedule_hash = $4)';
  const anchoring = `${current} AND status NOT IN ('SKIPPED_OVERLAP', 'PENDING')`;
  return {
    text: `SELECT tick, ${current} AS current, (${anchoring}) AS anchoring,
                  (status = 'RUNNING' AND token IS NULL) AS self_committed
             FROM ${schema}.runs
            WHERE namespace = $1 AND job = $2 AND tick <= $3
              AND tick >= COALESCE(
                    (SELECT min(tick) FROM (
                       SELECT tick FROM (
                         SELECT tick, status, schedule_hash FROM ${schema}.runs
                          WHERE namespace = $1 AND job = $2 AND tick <= $3
                          ORDER BY tick DESC LIMIT $6::int4) latest
                        WHERE ${anchoring}
                        ORDER BY tick DESC LIMIT $5::int4) anchors),
                    '-infinity')
            ORDER BY tick DESC LIMIT $6::int4`,
    params: [namespace, job, iso(horizon), hash, window, cap],
  };
}

/**
 * Claims a tick: inserts it RUNNING (attempt 1), or takes a PENDING row whose `retry_at` has come
 * (a retry, a queued tick, a tick given back) for its next attempt. One row (`attempt`) when
 * claimed; none when the tick is someone else's or already settled.
 */
export function claimTickStatement(
  { schema, namespace }: LedgerScope,
  job: string,
  tick: Date,
  claim: {
    readonly owner: string;
    readonly token: bigint | null;
    readonly hash: string;
    readonly now: Date;
  },
): Statement {
  return {
    text: `INSERT INTO ${schema}.runs AS r
                  (namespace, job, tick, status, owner, attempt, token, started_at, schedule_hash)
           VALUES ($1, $2, $3, 'RUNNING', $4, 1, $5::int8, now(), $6)
           ON CONFLICT (namespace, job, tick) DO UPDATE
              SET status = 'RUNNING', owner = excluded.owner, attempt = r.attempt + 1,
                  token = excluded.token, started_at = now(), finished_at = NULL,
                  retry_at = NULL, error = NULL
            WHERE r.status = 'PENDING' AND r.retry_at <= $7
           RETURNING attempt`,
    params: [
      namespace,
      job,
      iso(tick),
      claim.owner,
      tokenParam(claim.token),
      claim.hash,
      iso(claim.now),
    ],
  };
}

/** How a claimed run ended, as the ledger records it. */
export type RunRecord =
  | { readonly kind: 'succeeded' }
  | { readonly kind: 'failed'; readonly error: string }
  | { readonly kind: 'retry'; readonly error: string; readonly retryAt: Date };

/**
 * Ends a claimed tick: SUCCEEDED, FAILED with its error, or PENDING until `retryAt` for another
 * attempt. In lease mode only under the run's own fencing token (`token`), so a stale holder
 * cannot rewrite it; in transaction mode (`token` null) only a row with no token, so a late
 * record of a transaction-mode run can never rewrite a lease-mode run of the same tick. One row
 * when recorded.
 */
export function finishTickStatement(
  { schema, namespace }: LedgerScope,
  job: string,
  tick: Date,
  token: bigint | null,
  record: RunRecord,
): Statement {
  const status =
    record.kind === 'succeeded' ? 'SUCCEEDED' : record.kind === 'failed' ? 'FAILED' : 'PENDING';
  return {
    text: `UPDATE ${schema}.runs
              SET status = $4, finished_at = CASE WHEN $4 = 'PENDING' THEN NULL ELSE now() END,
                  error = $5, retry_at = $6, owner = CASE WHEN $4 = 'PENDING' THEN NULL ELSE owner END
            WHERE namespace = $1 AND job = $2 AND tick = $3 AND status = 'RUNNING'
              AND token IS NOT DISTINCT FROM $7::int8
           RETURNING tick`,
    params: [
      namespace,
      job,
      iso(tick),
      status,
      record.kind === 'succeeded' ? null : record.error.slice(0, MAX_ERROR_LENGTH),
      record.kind === 'retry' ? iso(record.retryAt) : null,
      tokenParam(token),
    ],
  };
}

/**
 * Gives a lease-mode run's tick back — stop() aborted it, or the database went away under its
 * fenced write — PENDING again, due at once (see `dueAtOnce`), `note` saying why; the attempt not counted unless
 * `countAttempt` (an interrupted run counts, so that give-backs stay bounded). Only under the
 * run's own token. One row when given back.
 */
export function giveBackClaimStatement(
  { schema, namespace }: LedgerScope,
  job: string,
  tick: Date,
  token: bigint,
  now: Date,
  note: string,
  countAttempt: boolean,
): Statement {
  return {
    text: `UPDATE ${schema}.runs
              SET status = 'PENDING', attempt = attempt - $7::int,
                  retry_at = ${dueAtOnce('tick', '$5::timestamptz')}, owner = NULL,
                  token = NULL, started_at = NULL, error = $6
            WHERE namespace = $1 AND job = $2 AND tick = $3 AND status = 'RUNNING' AND token = $4::int8
           RETURNING tick`,
    params: [namespace, job, iso(tick), String(token), iso(now), note, countAttempt ? 0 : 1],
  };
}

/**
 * Records `ticks` PENDING, due at once (see `dueAtOnce`; attempt 0, `note` in `error`), each unless it has a row: a
 * tick given back, or held for catch-up. One statement for any number of ticks; the rows
 * recorded (`tick`).
 */
export function pendingTicksStatement(
  { schema, namespace }: LedgerScope,
  job: string,
  ticks: readonly Date[],
  hash: string,
  now: Date,
  note: string,
): Statement {
  return {
    text: insertPending(schema, 't::timestamptz', 'json_array_elements_text($3::text::json) AS t'),
    params: [namespace, job, JSON.stringify(ticks.map(iso)), iso(now), hash, note],
  };
}

/**
 * The insert of {@link pendingTicksStatement} and {@link owedTicksStatement}: a PENDING row, due at
 * once, for each `tick` (an expression) of `source` that has none; rows `tick`. Parameters: $1
 * namespace, $2 job, $4 now, $5 schedule hash, $6 note (the caller's $3 feeds `source`).
 */
function insertPending(schema: string, tick: string, source: string): string {
  return `INSERT INTO ${schema}.runs (namespace, job, tick, status, attempt, retry_at, schedule_hash, error)
           SELECT $1::text, $2::text, ${tick}, 'PENDING', 0, ${dueAtOnce(tick, '$4::timestamptz')},
                  $5::text, $6::text
             FROM ${source}
           ON CONFLICT (namespace, job, tick) DO NOTHING RETURNING tick`;
}

/**
 * {@link pendingTicksStatement} for the ticks a job's new owner owes (owned distribution): each
 * held only when its tick's lock (`key`) is free, and taken until the end of the transaction. A
 * tick whose lock is held is being decided or run — by the member that left, its transaction-mode
 * run still going, whose claim row is not committed: an insert of the same tick would wait on that
 * row for the whole run, and the new owner's ticks with it. Rows `tick` and `held`: true for a tick
 * held now, false for one whose lock was held (to ask again once that run is over); ticks that had
 * a row already give none.
 */
export function owedTicksStatement(
  { schema, namespace }: LedgerScope,
  job: string,
  ticks: readonly { readonly tick: Date; readonly key: LockKey }[],
  hash: string,
  now: Date,
  note: string,
): Statement {
  // [tick, key1, key2] for a two-int4 key, [tick, int8 key as text] for the other kind.
  const owed = ticks.map(({ tick, key }) =>
    key.pair ? [iso(tick), key.pair[0], key.pair[1]] : [iso(tick), String(key.int8)],
  );
  return {
    text: `WITH owed AS MATERIALIZED (
             SELECT (e->>0)::timestamptz AS tick,
                    CASE WHEN e->>2 IS NULL THEN pg_try_advisory_xact_lock((e->>1)::int8)
                         ELSE pg_try_advisory_xact_lock((e->>1)::int4, (e->>2)::int4) END AS free
               FROM json_array_elements($3::text::json) AS e
           ),
           held AS (${insertPending(schema, 'tick', 'owed WHERE free')})
           SELECT tick, true AS held FROM held
           UNION ALL SELECT tick, false FROM owed WHERE NOT free`,
    params: [namespace, job, JSON.stringify(owed), iso(now), hash, note],
  };
}

/**
 * Gives back the RUNNING rows of lease-mode runs whose token is older than the live one (their
 * holder died or lost the lease): PENDING, due at once (see `dueAtOnce`), the dead attempt not
 * counted. Rows `tick`.
 */
export function giveBackAbandonedStatement(
  { schema, namespace }: LedgerScope,
  job: string,
  liveToken: bigint,
  now: Date,
): Statement {
  return {
    text: `UPDATE ${schema}.runs
              SET status = 'PENDING', attempt = attempt - 1,
                  retry_at = ${dueAtOnce('tick', '$4::timestamptz')}, owner = NULL, token = NULL,
                  error = 'given back: the run did not finish under its fencing token'
            WHERE namespace = $1 AND job = $2 AND status = 'RUNNING'
              AND token IS NOT NULL AND token < $3::int8
           RETURNING tick`,
    params: [namespace, job, String(liveToken), iso(now)],
  };
}

/**
 * Records ticks that will not run (`SKIPPED_OVERLAP`, `MISSED`), each unless it already has a row:
 * one statement for any number of ticks. The rows recorded (`tick`).
 */
export function recordTicksStatement(
  { schema, namespace }: LedgerScope,
  job: string,
  ticks: readonly Date[],
  status: 'SKIPPED_OVERLAP' | 'MISSED',
  owner: string,
  hash: string,
): Statement {
  return {
    text: `INSERT INTO ${schema}.runs (namespace, job, tick, status, owner, finished_at, schedule_hash)
           SELECT $1::text, $2::text, t::timestamptz, $4::text, $5::text, now(), $6::text
             FROM json_array_elements_text($3::text::json) AS t
           ON CONFLICT (namespace, job, tick) DO NOTHING RETURNING tick`,
    params: [namespace, job, JSON.stringify(ticks.map(iso)), status, owner, hash],
  };
}

/**
 * Whether a tick of the job after `tick` has run, runs, or waits to run (any row but MISSED and
 * SKIPPED_OVERLAP). One row (`ran`).
 */
export function ranAfterStatement(
  { schema, namespace }: LedgerScope,
  job: string,
  tick: Date,
): Statement {
  return {
    text: `SELECT EXISTS (SELECT 1 FROM ${schema}.runs
                           WHERE namespace = $1 AND job = $2 AND tick > $3
                             AND status NOT IN ('MISSED', 'SKIPPED_OVERLAP')) AS ran`,
    params: [namespace, job, iso(tick)],
  };
}

/**
 * Queues a tick that overlaps a running one: PENDING, due at once (see `dueAtOnce`), unless it has a row already or
 * the job has `limit` PENDING rows. One row when queued.
 */
export function queueTickStatement(
  { schema, namespace }: LedgerScope,
  job: string,
  tick: Date,
  owner: string,
  hash: string,
  now: Date,
  limit: number,
): Statement {
  return {
    text: `INSERT INTO ${schema}.runs (namespace, job, tick, status, owner, attempt, retry_at, schedule_hash)
           SELECT $1::text, $2::text, $3::timestamptz, 'PENDING', $4::text, 0,
                  ${dueAtOnce('$3::timestamptz', '$6::timestamptz')}, $5::text
            WHERE (SELECT count(*) FROM ${schema}.runs
                    WHERE namespace = $1 AND job = $2 AND status = 'PENDING') < $7::int4
           ON CONFLICT (namespace, job, tick) DO NOTHING RETURNING tick`,
    params: [namespace, job, iso(tick), owner, hash, iso(now), limit],
  };
}

/** The job's oldest PENDING tick whose `retry_at` has come (`tick`), if any: what runs next. */
export function nextDueStatement(
  { schema, namespace }: LedgerScope,
  job: string,
  now: Date,
): Statement {
  return {
    text: `SELECT tick FROM ${schema}.runs
            WHERE namespace = $1 AND job = $2 AND status = 'PENDING' AND retry_at <= $3
            ORDER BY tick LIMIT 1`,
    params: [namespace, job, iso(now)],
  };
}

/**
 * What a drain does next: the job's oldest PENDING tick whose `retry_at` has come (`tick`, `due`
 * true), or, when none has, the PENDING tick due soonest (`due` false, `retry_at`) — a drain that
 * leaves it keeps a timer for it. No row when nothing is PENDING.
 */
export function nextPendingStatement(
  { schema, namespace }: LedgerScope,
  job: string,
  now: Date,
): Statement {
  return {
    text: `SELECT tick, retry_at, retry_at <= $3 AS due FROM ${schema}.runs
            WHERE namespace = $1 AND job = $2 AND status = 'PENDING'
            ORDER BY retry_at <= $3 DESC, CASE WHEN retry_at <= $3 THEN tick ELSE retry_at END, tick
            LIMIT 1`,
    params: [namespace, job, iso(now)],
  };
}

/**
 * Whether a lease-mode job's lease is held (in progress and not expired, on the server's clock):
 * one row, `held`. Its holder records its run's end later, and then runs what is due.
 */
export function leaseHeldStatement(schema: string, leaseNamespace: string, job: string): Statement {
  return {
    text: `SELECT EXISTS (SELECT 1 FROM ${schema}.leases
                           WHERE namespace = $1 AND job_key = $2 AND status = 'IN_PROGRESS'
                             AND expires_at > clock_timestamp()) AS held`,
    params: [leaseNamespace, job],
  };
}

/** Deletes ledger rows older than `retentionMs`, always keeping the job's latest row and open ones. */
export function pruneStatement(
  { schema, namespace }: LedgerScope,
  job: string,
  retentionMs: number,
): Statement {
  return {
    // Only a prefix of the job's rows by tick: never its latest row, nor any row after its oldest
    // PENDING or RUNNING one. Catch-up reads a tick with no row between the oldest of its recent
    // rows and now as a hole: a row deleted after a row kept would be run again, or recorded MISSED.
    text: `DELETE FROM ${schema}.runs
            WHERE namespace = $1 AND job = $2
              AND tick < now() - $3::float8 * interval '1 millisecond'
              AND status NOT IN ('RUNNING', 'PENDING')
              AND tick < (SELECT max(tick) FROM ${schema}.runs WHERE namespace = $1 AND job = $2)
              AND tick < ALL (SELECT tick FROM ${schema}.runs
                               WHERE namespace = $1 AND job = $2
                                 AND status IN ('RUNNING', 'PENDING'))`,
    params: [namespace, job, retentionMs],
  };
}

/**
 * Registers (or refreshes) `owner`'s schedules of many jobs at once: `rows` is a JSON array of
 * `[job, cron, timezone, hash]`, one per job, no job twice. A JSON text rather than arrays, so
 * that every adapter's driver passes it as the one string it is (typed `text`, then read as
 * JSON: a driver that encodes by the type the server describes would encode a `json` one again).
 */
export function registerSchedulesStatement(
  { schema, namespace }: LedgerScope,
  owner: string,
  rows: string,
): Statement {
  return {
    text: `INSERT INTO ${schema}.schedules (namespace, job, owner, cron, timezone, schedule_hash)
           SELECT $1::text, r->>0, $2::text, r->>1, r->>2, r->>3
             FROM json_array_elements($3::text::json) AS r
           ON CONFLICT (namespace, job, owner) DO UPDATE
              SET cron = excluded.cron, timezone = excluded.timezone,
                  schedule_hash = excluded.schedule_hash, heartbeat_at = now()`,
    params: [namespace, owner, rows],
  };
}

/**
 * The live registrations (heartbeat within `liveMs`) of those of `jobs` (a JSON array whose
 * elements are arrays with the job's name first, as {@link registerSchedulesStatement} takes) that
 * live instances registered under more than one schedule: `job`, `owner`, `cron`,
 * `timezone`, `schedule_hash`, by job and owner. Jobs with one schedule give no rows.
 */
export function conflictingRegistrationsStatement(
  { schema, namespace }: LedgerScope,
  jobs: string,
  liveMs: number,
): Statement {
  return {
    text: `SELECT job, owner, cron, timezone, schedule_hash
             FROM (SELECT job, owner, cron, timezone, schedule_hash,
                          min(schedule_hash) OVER (PARTITION BY job) AS lowest,
                          max(schedule_hash) OVER (PARTITION BY job) AS highest
                     FROM ${schema}.schedules
                    WHERE namespace = $1::text
                      AND job IN (SELECT r->>0 FROM json_array_elements($2::text::json) AS r)
                      AND heartbeat_at > now() - $3::float8 * interval '1 millisecond') AS live
            WHERE lowest <> highest
            ORDER BY job, owner`,
    params: [namespace, jobs, liveMs],
  };
}

/**
 * The live registrations (heartbeat within `liveMs`) of a job: `owner`, `cron`, `timezone`,
 * `schedule_hash`, by owner.
 */
export function liveSchedulesStatement(
  { schema, namespace }: LedgerScope,
  job: string,
  liveMs: number,
): Statement {
  return {
    text: `SELECT owner, cron, timezone, schedule_hash FROM ${schema}.schedules
            WHERE namespace = $1 AND job = $2
              AND heartbeat_at > now() - $3::float8 * interval '1 millisecond'
            ORDER BY owner`,
    params: [namespace, job, liveMs],
  };
}

/** Refreshes the heartbeat of every registration of `owner`. */
export function heartbeatSchedulesStatement(
  { schema, namespace }: LedgerScope,
  owner: string,
): Statement {
  return {
    text: `UPDATE ${schema}.schedules SET heartbeat_at = now() WHERE namespace = $1 AND owner = $2`,
    params: [namespace, owner],
  };
}

/** Removes every registration of `owner` (the scheduler stopped). */
export function deregisterSchedulesStatement(
  { schema, namespace }: LedgerScope,
  owner: string,
): Statement {
  return {
    text: `DELETE FROM ${schema}.schedules WHERE namespace = $1 AND owner = $2`,
    params: [namespace, owner],
  };
}

/**
 * Jobs registered live (heartbeat within `liveMs`) under more than one schedule, in `namespace`
 * or (null) across every namespace: `namespace`, `job`, `schedules` (text).
 */
export function conflictingSchedulesStatement(
  schema: string,
  liveMs: number,
  namespace: string | null = null,
): Statement {
  return {
    text: `SELECT namespace, job,
                  string_agg(DISTINCT format('%s (%s) by %s', cron, timezone, owner), '; ') AS schedules
             FROM ${schema}.schedules
            WHERE heartbeat_at > now() - $1::float8 * interval '1 millisecond'
              AND ($2::text IS NULL OR namespace = $2::text)
            GROUP BY namespace, job HAVING count(DISTINCT schedule_hash) > 1
            ORDER BY namespace, job`,
    params: [liveMs, namespace],
  };
}

/**
 * Settings of a transaction-mode run once its lock is held: `statement_timeout` bounds the
 * handler (`$1` ms, or the session default when NULL), and `lock_timeout` (the claim's wait) goes
 * back to the session default, so neither the wait nor the handler is cut by the other's bound.
 */
export const RUN_SETTINGS = `SELECT set_config('statement_timeout',
           coalesce($1::text, (SELECT reset_val FROM pg_settings WHERE name = 'statement_timeout')), true),
         set_config('lock_timeout', (SELECT reset_val FROM pg_settings WHERE name = 'lock_timeout'), true)`;

/** Lifts the run's `statement_timeout` so that the ledger records after a timed-out handler go through. */
export const RECORD_SETTINGS = `SELECT set_config('statement_timeout', '0', true)`;

/** Savepoint statements that let a failed transaction-mode run record its failure with its claim. */
export const SAVEPOINT = 'SAVEPOINT lockkit_run';
/** See {@link SAVEPOINT}. */
export const ROLLBACK_TO_SAVEPOINT = 'ROLLBACK TO SAVEPOINT lockkit_run';
/** See {@link SAVEPOINT}. */
export const RELEASE_SAVEPOINT = 'RELEASE SAVEPOINT lockkit_run';

/** Whether `$1` (a schema's unquoted name) has the scheduler's schedules table: one row, `present`. */
export const SCHEDULES_TABLE_PRESENT = `
  SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class c
                   JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                  WHERE n.nspname = $1::text AND c.relname = 'schedules') AS present`;
