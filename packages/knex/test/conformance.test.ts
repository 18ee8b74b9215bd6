import { fileURLToPath } from 'node:url';
import { runConformance } from '@lockkit/conformance';
import { testDatabaseUrl, testPgBouncer } from '@lockkit/test-db';
import { startEmbeddedPostgres } from '@lockkit/test-db/embedded';
import { knexInstance } from './instances.js';

runConformance(
  {
    name: 'knex',
    databaseUrl: testDatabaseUrl,
    standby: ({ prepare }) => startEmbeddedPostgres({ standby: true, prepare }),
    pgbouncer: testPgBouncer,
    createInstance: ({ url, poolSize, transactionPooler }) =>
      knexInstance(url, poolSize, transactionPooler),
    nativeQuery: (trx, text) => trx.raw(text),
    workerModule: fileURLToPath(new URL('./worker.mjs', import.meta.url)),
  },
  { schedulerFaultPoints: true },
);
