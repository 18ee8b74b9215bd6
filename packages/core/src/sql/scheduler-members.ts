/**
 * The statements of the scheduler's membership table (`<schema>.scheduler_members`), for owned
 * distribution: one row per running scheduler instance of a namespace, kept live by its heartbeat.
 * Liveness is the database's clock (`expires_at > clock_timestamp()`): the instances' clocks,
 * which may disagree, never decide who is live.
 */
import type { Statement } from './locks.js';
import type { LedgerScope } from './scheduler.js';

/**
 * One heartbeat of `member` (its process: `incarnation`, new at each start), in one statement: its
 * row made live for `ttlMs` more, and the namespace's other rows that are live, or stopped being
 * live within the departure window: since the previous heartbeat's read (`previousMs`, epoch ms on
 * the database's clock; null for the first) or within the last `windowMs`, whichever reaches back
 * further — a departure is seen by every member whose heartbeats went on, however long one of
 * them failed. Rows: `member`, `incarnation`, `heartbeat_ms` (its last heartbeat, or its stop;
 * epoch ms), `live`, and `db_now_ms` (the statement's instant) on each; the member's own row comes
 * back too, so that a namespace of one still answers with `db_now_ms`.
 *
 * A member id taken over by a new incarnation (a process restarted under a fixed `owner`, before
 * its old row expired) is a departure too: its row keeps the old incarnation's last heartbeat
 * (`predecessor_at`), returned as one more row, not live, while within the window — for the
 * member's own beat as for the others'.
 */
export function memberHeartbeatStatement(
  { schema, namespace }: LedgerScope,
  member: string,
  incarnation: string,
  ttlMs: number,
  previousMs: number | null,
  windowMs: number,
): Statement {
  return {
    text: `WITH beat AS (
             INSERT INTO ${schema}.scheduler_members AS m
                    (namespace, member, incarnation, heartbeat_at, expires_at)
             VALUES ($1::text, $2::text, $6::text, clock_timestamp(),
                     clock_timestamp() + $3::float8 * interval '1 millisecond')
             ON CONFLICT (namespace, member) DO UPDATE
                SET heartbeat_at = excluded.heartbeat_at, expires_at = excluded.expires_at,
                    incarnation = excluded.incarnation,
                    predecessor_at = CASE WHEN m.incarnation = excluded.incarnation
                                          THEN m.predecessor_at ELSE m.heartbeat_at END
             RETURNING member, incarnation, heartbeat_at, predecessor_at
           ),
           since AS (
             SELECT least(coalesce(to_timestamp($4::float8 / 1000), clock_timestamp()),
                          clock_timestamp() - $5::float8 * interval '1 millisecond') AS at
           ),
           others AS (
             SELECT member, incarnation, heartbeat_at, expires_at, predecessor_at
               FROM ${schema}.scheduler_members
              WHERE namespace = $1::text AND member <> $2::text
           )
           SELECT member, incarnation,
                  (extract(epoch FROM heartbeat_at) * 1000)::float8 AS heartbeat_ms,
                  true AS live, (extract(epoch FROM clock_timestamp()) * 1000)::float8 AS db_now_ms
             FROM beat
           UNION ALL
           SELECT member, incarnation, (extract(epoch FROM heartbeat_at) * 1000)::float8,
                  expires_at > clock_timestamp(),
                  (extract(epoch FROM clock_timestamp()) * 1000)::float8
             FROM others, since
            WHERE expires_at > since.at
           UNION ALL
           SELECT member, NULL, (extract(epoch FROM predecessor_at) * 1000)::float8, false,
                  (extract(epoch FROM clock_timestamp()) * 1000)::float8
             FROM (SELECT member, predecessor_at FROM beat
                   UNION ALL SELECT member, predecessor_at FROM others) AS replaced, since
            WHERE predecessor_at > since.at`,
    params: [namespace, member, ttlMs, previousMs, windowMs, incarnation],
  };
}

/**
 * `member` leaves at once (its scheduler stopped): its row stops being live now (`expires_at`, which
 * the others' departure window reads), and its departure — what its successors owe its jobs' ticks
 * from — is dated at `departedMs` (epoch ms on the database's clock: the stop, which a leave written
 * late comes after), or now when that is null or later. A row that already expired is left as it
 * is: its last heartbeat is what the successors owe from. (An expired row's `expires_at` is
 * exactly a TTL after its `heartbeat_at`; a left row's, less, unless its departure was dated at a
 * tick it had been deciding for longer than that.)
 */
export function memberLeaveStatement(
  { schema, namespace }: LedgerScope,
  member: string,
  departedMs: number | null,
): Statement {
  return {
    text: `UPDATE ${schema}.scheduler_members AS m
              SET heartbeat_at = least(left_at.at, coalesce(to_timestamp($3::float8 / 1000), left_at.at)),
                  expires_at = left_at.at
             FROM (SELECT clock_timestamp() AS at) AS left_at
            WHERE m.namespace = $1 AND m.member = $2 AND m.expires_at > left_at.at`,
    params: [namespace, member, departedMs],
  };
}

/** Removes the namespace's rows that stopped being live more than `keepMs` ago. */
export function pruneMembersStatement(
  { schema, namespace }: LedgerScope,
  keepMs: number,
): Statement {
  return {
    text: `DELETE FROM ${schema}.scheduler_members
            WHERE namespace = $1 AND expires_at < clock_timestamp() - $2::float8 * interval '1 millisecond'`,
    params: [namespace, keepMs],
  };
}

/**
 * Among the jobs that the live `members` (a JSON array of member ids) registered in the
 * schedules table, those that not every one of them registered: `job`, and `owners` (a JSON
 * array of the members that did). Jobs every live member registered give no row.
 */
export function partialRegistrationsStatement(
  { schema, namespace }: LedgerScope,
  members: string,
): Statement {
  return {
    text: `SELECT job, json_agg(owner)::text AS owners
             FROM ${schema}.schedules
            WHERE namespace = $1::text
              AND owner IN (SELECT json_array_elements_text($2::text::json))
            GROUP BY job
           HAVING count(*) < json_array_length($2::text::json)`,
    params: [namespace, members],
  };
}
