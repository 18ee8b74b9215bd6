import { fileURLToPath } from 'node:url';
import { runConformance } from '@lockkit/conformance';
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
  // Which reserve holds which postgres.js connection (seen by the `onexecute` lockkit passes with a
  // reserve's first statement), and the pool's close hook: a reserve whose connection closed is not
  // out any more, released or not (lockkit's first call closes one connection it reserved, to learn
  // the pool's queues; postgres.js has it in its closed queue then).
  const holders = new Map<unknown, { dead?: boolean }>();
  const onclose = sql.options.onclose;
  sql.options.onclose = (connectionId: number) => {
    const holder = holders.get(connectionId);
    if (holder !== undefined) holder.dead = true;
    if (typeof onclose === 'function') onclose(connectionId);
  };
  const counted = {
    unsafe: sql.unsafe.bind(sql),
    options: sql.options,
    reserve: async () => {
      const reserved = await sql.reserve();
      const entry: { pid?: number | undefined; dead?: boolean } = {};
      open.set(reserved, entry);
      const unsafe = reserved.unsafe.bind(reserved);
      reserved.unsafe = ((
        text: string,
        params?: never[],
        options?: { onexecute?: (connection: unknown) => boolean },
      ) => {
        const onexecute = options?.onexecute;
        const seen =
          typeof onexecute === 'function'
            ? {
                ...options,
                onexecute: (connection: unknown) => {
                  holders.set((connection as { id?: unknown } | null)?.id, entry);
                  return onexecute(connection);
                },
              }
            : options;
        const pending = unsafe(text, params, seen as never);
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

for (const prepare of [true, false]) {
  runConformance(
    {
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
    // The scheduler and migration fault points: searched directly with prepare: true, and through
    // PgBouncer with prepare: false; a third search (direct, prepare: false) would repeat the first
    // one's boundaries with unnamed statements, several minutes of CI for little.
    { schedulerFaultPoints: prepare ? true : 'through-pgbouncer' },
  );
}
