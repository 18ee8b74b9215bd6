import { fileURLToPath } from 'node:url';
import { runConformance } from '@lockkit/conformance';
import { testDatabaseUrl, testPgBouncer } from '@lockkit/test-db';
import { startEmbeddedPostgres } from '@lockkit/test-db/embedded';
import pg from 'pg';
import { pgExecutor } from '../src/index.js';

// The scheduler's worker-process case runs long enough here for ≥ 30 judged ticks per job.
runConformance(
  {
    name: 'pg (Pool)',
    databaseUrl: testDatabaseUrl,
    standby: ({ prepare }) => startEmbeddedPostgres({ standby: true, prepare }),
    pgbouncer: testPgBouncer,
    createInstance: ({ url, poolSize, transactionPooler }) => {
      const pool = new pg.Pool({ connectionString: url, max: poolSize });
      // An idle pooled connection can be cut (a terminated backend, a closed proxy); the pool
      // discards it and reports it here.
      pool.on('error', () => {});
      return {
        executor: pgExecutor(pool, { transactionPooler: transactionPooler ?? false }),
        checkedOut: () => pool.totalCount - pool.idleCount,
        close: () => pool.end(),
      };
    },
    nativeQuery: (client, text) => client.query(text),
    singleConnection: async (url) => {
      const client = new pg.Client({ connectionString: url });
      client.on('error', () => {});
      await client.connect();
      return {
        executor: pgExecutor(client) as never,
        query: (text) => client.query(text),
        close: () => client.end(),
      };
    },
    workerModule: fileURLToPath(new URL('./worker-instance.mjs', import.meta.url)),
  },
  { schedulerSeconds: 36, schedulerFaultPoints: true },
);
