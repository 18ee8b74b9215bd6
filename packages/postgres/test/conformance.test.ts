import { fileURLToPath } from 'node:url';
import {
  type ConformanceCaseId,
  faultPointCaseIds,
  LEASE_FAULT_PROTOCOLS,
  runConformance,
  SCHEDULER_FAULT_OPERATIONS,
  SESSION_FAULT_PROTOCOLS,
  schedulerFaultPointCaseIds,
  TRANSACTION_FAULT_PROTOCOLS,
} from '@lockkit/conformance';
import { isConnectionLoss } from '@lockkit/core/adapter';
import { testDatabaseUrl, testPgBouncer } from '@lockkit/test-db';
import { startEmbeddedPostgres } from '@lockkit/test-db/embedded';
import postgres from 'postgres';
import { type PostgresReservedLike, postgresExecutor } from '../src/index.js';

/**
 * A postgres.js instance whose reserved connections are counted. A connection that died is
 * deliberately never released (postgres.js would crash reusing it; it reconnects the slot on its
 * own), so "checked out" counts the unreleased reserves that are still alive: whose backend still
 * exists, and which have not failed with a lost connection themselves (through PgBouncer, a client
 * link that died leaves its server backend alive in the pooler's pool).
 */
function instance(url: string, poolSize: number, prepare: boolean, transactionPooler: boolean) {
  const sql = postgres(url, { max: poolSize, prepare, onnotice: () => {} });
  const open = new Map<PostgresReservedLike, { pid?: number | undefined; dead?: boolean }>();
  let looking: postgres.Sql | undefined;
  const counted = {
    unsafe: sql.unsafe.bind(sql),
    options: sql.options,
    reserve: async () => {
      const reserved = await sql.reserve();
      const entry: { pid?: number | undefined; dead?: boolean } = {};
      open.set(reserved, entry);
      const unsafe = reserved.unsafe.bind(reserved);
      reserved.unsafe = ((text: string, params?: never[], options?: object) => {
        const pending = unsafe(text, params, options);
        void Promise.resolve(pending).catch((error: unknown) => {
          if (isConnectionLoss(error)) entry.dead = true;
        });
        if (entry.pid === undefined && text.includes('pg_backend_pid() AS pid')) {
          void Promise.resolve(pending).then(
            (result: unknown) => {
              const rows = result as { pid?: number }[] & { command?: string };
              const first =
                typeof rows.command === 'string'
                  ? rows[0]
                  : (rows as unknown as { pid?: number }[][])[1]?.[0];
              entry.pid = first?.pid;
            },
            () => {},
          );
        }
        return pending;
      }) as typeof reserved.unsafe;
      const release = reserved.release.bind(reserved);
      reserved.release = () => {
        open.delete(reserved);
        release();
      };
      return reserved;
    },
  };
  return {
    executor: postgresExecutor(counted, { transactionPooler }),
    checkedOut: async () => {
      const live = [...open.values()].filter((e) => e.dead !== true);
      if (live.length === 0) return 0;
      const pids = live.map((e) => e.pid ?? -1);
      // Asked on a connection of its own: the pool under test may be wedged by the very reserve
      // this counts (a pool of one whose connection is out), and must not be needed to tell so.
      looking ??= postgres(url, { max: 1, prepare, onnotice: () => {} });
      const alive = await looking<{ pid: number }[]>`
        SELECT pid FROM pg_stat_activity WHERE pid = ANY(${pids}::int4[])`;
      return pids.filter((pid) => pid === -1 || alive.some((a) => a.pid === pid)).length;
    },
    close: () =>
      Promise.all([sql.end({ timeout: 5 }), looking?.end({ timeout: 5 })]).then(() => undefined),
  };
}

/**
 * A known defect the fault-point group found, in postgres.js itself (3.4.9, `src/connection.js`):
 * a FATAL (57P01) that arrives while a query runs is kept for the ReadyForQuery that never comes,
 * and `closed()` does not clear it; the slot's next connect hands it to its first query. When that
 * is a `sql.reserve()`, the reserve rejects CONNECTION_LOST and its request stays queued, so the
 * reconnected connection is later handed to the rejected promise: the slot is lost to the pool
 * (a retried reserve on a pool of one waits forever — measured). The executor reconnects the slot
 * of a lease's connection that closed under it with a throwaway query of its own
 * (`src/stale-fatal.ts`): the dead-start group (a dead connection lent at the start of a call)
 * passes, every run, under load too. A backend terminated in the middle of a transaction or a
 * session still reaches the next caller at times: the transaction and session fault points pass
 * unloaded (every boundary, both modes) but failed under stress-ng (2 runs of 3, next caller
 * CONNECTION_LOST at a mid-transaction boundary): skipped visibly, neither passing nor failing
 * every time. The lease run meets it every time directly with prepare: true (the call after the
 * terminated claim gets CONNECTION_LOST): run as an expected failure; through PgBouncer
 * (prepare: false) where it fails varies: skipped visibly.
 */
const staleFatal = (prepare: boolean) => {
  const reason =
    "known defect (postgres.js): a terminated backend's FATAL (57P01) outlives its connection and rejects the slot's next sql.reserve() CONNECTION_LOST, leaking that slot";
  const flaky = faultPointCaseIds(
    ['terminated'],
    [...TRANSACTION_FAULT_PROTOCOLS, ...SESSION_FAULT_PROTOCOLS],
    `${reason} — since lockkit reconnects the slot it passes unloaded, but not yet under load`,
  );
  const lease = faultPointCaseIds(['terminated'], LEASE_FAULT_PROTOCOLS, reason);
  // The scheduler and migration fault points meet it at boundary 1 in both modes, each run then
  // waiting out its watchdog: skipped visibly rather than run as expected failures.
  const scheduler = schedulerFaultPointCaseIds(['terminated'], SCHEDULER_FAULT_OPERATIONS, reason);
  // This case ends its own backend on every run (five times in a row): from the second run on the
  // stale FATAL meets the slot's next checkout (measured: 3 or 4 runs of 5, a connection left
  // checked out). Skipped visibly; its one-termination sibling still runs.
  const bounded: Partial<Record<ConformanceCaseId, string>> = {
    'scheduler.lease-fenced-write-lost-bounded': reason,
  };
  return prepare
    ? { expectedFailures: lease, disable: { ...flaky, ...scheduler, ...bounded } }
    : { disable: { ...flaky, ...lease, ...scheduler, ...bounded } };
};

for (const prepare of [true, false]) {
  runConformance(
    {
      ...staleFatal(prepare),
      name: `postgres.js (prepare: ${prepare})`,
      databaseUrl: testDatabaseUrl,
      standby: ({ prepare }) => startEmbeddedPostgres({ standby: true, prepare }),
      // postgres.js with prepare: true hangs behind PgBouncer in transaction mode (its named
      // statements): the PgBouncer groups run once, with prepare: false, as users must configure it.
      ...(prepare ? {} : { pgbouncer: testPgBouncer }),
      createInstance: ({ url, poolSize, transactionPooler }) =>
        instance(url, poolSize, prepare, transactionPooler ?? false),
      nativeQuery: (tx, text) => tx.unsafe(text),
      workerModule: fileURLToPath(new URL('./worker-instance.mjs', import.meta.url)),
    },
    { schedulerFaultPoints: true },
  );
}
