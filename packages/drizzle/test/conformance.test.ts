import { fileURLToPath } from 'node:url';
import { runConformance } from '@lockkit/conformance';
import { testDatabaseUrl, testPgBouncer } from '@lockkit/test-db';
import { startEmbeddedPostgres } from '@lockkit/test-db/embedded';
import { sql } from 'drizzle-orm';
import {
  nodePostgresClientInstance,
  nodePostgresInstance,
  postgresJsInstance,
} from './instances.js';

const worker = (name: string) => fileURLToPath(new URL(`./worker-${name}.mjs`, import.meta.url));

runConformance(
  {
    name: 'drizzle on node-postgres',
    databaseUrl: testDatabaseUrl,
    standby: ({ prepare }) => startEmbeddedPostgres({ standby: true, prepare }),
    pgbouncer: testPgBouncer,
    createInstance: ({ url, poolSize, transactionPooler }) =>
      nodePostgresInstance(url, poolSize, transactionPooler),
    nativeQuery: (tx, text) => tx.execute(sql.raw(text)),
    singleConnection: async (url) => (await nodePostgresClientInstance(url)) as never,
    workerModule: worker('node-postgres'),
  },
  { schedulerFaultPoints: true },
);

runConformance(
  {
    name: 'drizzle on postgres.js',
    databaseUrl: testDatabaseUrl,
    standby: ({ prepare }) => startEmbeddedPostgres({ standby: true, prepare }),
    pgbouncer: testPgBouncer,
    // Through PgBouncer the instance uses prepare: false, as postgres.js needs there.
    createInstance: ({ url, poolSize, transactionPooler }) =>
      postgresJsInstance(url, poolSize, transactionPooler),
    nativeQuery: (tx, text) => tx.execute(sql.raw(text)),
    workerModule: worker('postgres-js'),
    disable: {
      'truth.pool-of-one-abort':
        "Drizzle's postgres.js transactions expose no pending query to cancel, and a pool of one has no second connection",
    },
  },
  { schedulerFaultPoints: true },
);
