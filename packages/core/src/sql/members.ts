/**
 * The statements of the scheduler's membership (`<schema>.members`), used with `decide: 'owner'`:
 * one row per scheduler instance and namespace, its `heartbeat_at` an instant of that instance's
 * own clock (passed in, as every instant of the ledger is). A heartbeat is one statement per
 * instance, whatever the number of its jobs.
 */
import type { Statement } from './locks.js';

const iso = (d: Date) => d.toISOString();

/**
 * Records this instance's heartbeat at `now` and reads every member live at `now` (heartbeat
 * within `liveMs`), this instance included: `owner`, `heartbeat_at` (text, ISO). In the same
 * statement, drops rows dead for `forgetMs` (instances killed long ago).
 *
 * The data-modifying CTE's row is not visible to the outer SELECT (one snapshot), so this
 * instance's own row comes from the CTE's RETURNING.
 */
export function heartbeatMembersStatement(
  schema: string,
  namespace: string,
  owner: string,
  now: Date,
  liveMs: number,
  forgetMs: number,
): Statement {
  return {
    text: `WITH beat AS (
             INSERT INTO ${schema}.members AS m (namespace, owner, heartbeat_at)
             VALUES ($1, $2, $3::timestamptz)
             ON CONFLICT (namespace, owner) DO UPDATE
                SET heartbeat_at = greatest(m.heartbeat_at, excluded.heartbeat_at)
             RETURNING owner, heartbeat_at),
           forget AS (
             DELETE FROM ${schema}.members
              WHERE namespace = $1 AND owner <> $2
                AND heartbeat_at < $3::timestamptz - $5::float8 * interval '1 millisecond')
           SELECT owner, to_json(heartbeat_at)#>>'{}' AS heartbeat_at FROM beat
           UNION ALL
           SELECT owner, to_json(heartbeat_at)#>>'{}' FROM ${schema}.members
            WHERE namespace = $1 AND owner <> $2
              AND heartbeat_at > $3::timestamptz - $4::float8 * interval '1 millisecond'`,
    params: [namespace, owner, iso(now), liveMs, forgetMs],
  };
}

/** Removes this instance's membership (a clean stop): its jobs pass to the next in order at once. */
export function leaveMembersStatement(schema: string, namespace: string, owner: string): Statement {
  return {
    text: `DELETE FROM ${schema}.members WHERE namespace = $1 AND owner = $2`,
    params: [namespace, owner],
  };
}
