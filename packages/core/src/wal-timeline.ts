/**
 * Whether a server lets a lease claim read its WAL timeline, the epoch of fencing tokens (see
 * `TOKEN_SEQUENCE_BITS` in `sql/leases.ts`).
 *
 * PostgreSQL does, to every role. Some managed engines do not: Aurora PostgreSQL answers
 * `pg_current_wal_lsn()` with "not supported" (SQLSTATE 0A000), and a claim that called it would
 * fail every time. So, once per executor, before its first claim, lockkit asks in a transaction of
 * its own, and on such an engine claims without an epoch: tokens still count up by one on each
 * claim, as they did before epochs existed, and a failover that loses the newest claim can issue
 * its token again (Aurora's failover keeps every acknowledged commit on its shared storage,
 * by AWS's description; not tested here).
 *
 * @packageDocumentation
 */
import { abandonableCheckout } from './abandonable-checkout.js';
import type { LockExecutor } from './executor.js';
import { sqlState } from './postgres-errors.js';
import { TIMELINE_PROBE_STATEMENT, type TimelineSource } from './sql/leases.js';

/**
 * SQLSTATEs meaning "this engine will never tell": feature not supported (Aurora), undefined
 * function (an engine without them), insufficient privilege (a role denied them).
 */
const NEVER_TELLS = new Set(['0A000', '42883', '42501']);

const known = new WeakMap<object, TimelineSource>();

/**
 * Where `executor`'s server lets claims read their epoch. The answer is kept per executor; a
 * probe that fails for another reason (a lost connection, a standby: 55000) is not kept, and the
 * claim goes on with `'wal'` (a standby then refuses the claim itself, as a read-only write).
 * A `signal` that fires while the probe waits for a connection rejects with `aborted(signal)`.
 */
export async function timelineSource(
  executor: LockExecutor<unknown, unknown>,
  signal?: AbortSignal,
  aborted: (signal: AbortSignal) => Error = (s) => s.reason as Error,
): Promise<TimelineSource> {
  const cached = known.get(executor);
  if (cached !== undefined) return cached;
  try {
    // The caller's signal ends the probe's wait for a connection, as it does a lock call's.
    await abandonableCheckout(
      signal,
      (checkout) =>
        executor.transaction(({ query }) => {
          if (!checkout.enter()) throw aborted(signal as AbortSignal);
          return query(TIMELINE_PROBE_STATEMENT, []);
        }),
      aborted,
    );
    known.set(executor, 'wal');
    return 'wal';
  } catch (error) {
    if (signal?.aborted) throw aborted(signal);
    const state = sqlState(error);
    if (state !== undefined && NEVER_TELLS.has(state)) {
      known.set(executor, 'none');
      return 'none';
    }
    return 'wal';
  }
}
