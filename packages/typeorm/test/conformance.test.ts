import { fileURLToPath } from 'node:url';
import { runConformance } from '@lockkit/conformance';
import { testDatabaseUrl, testPgBouncer } from '@lockkit/test-db';
import { startEmbeddedPostgres } from '@lockkit/test-db/embedded';
import { typeormInstance } from './instances.js';

runConformance(
  {
    name: 'typeorm (postgres driver)',
    databaseUrl: testDatabaseUrl,
    standby: ({ prepare }) => startEmbeddedPostgres({ standby: true, prepare }),
    pgbouncer: testPgBouncer,
    createInstance: ({ url, poolSize, transactionPooler }) =>
      typeormInstance(url, poolSize, transactionPooler),
    nativeQuery: (manager, text) => manager.query(text),
    workerModule: fileURLToPath(new URL('./worker-instance.mjs', import.meta.url)),
  },
  { schedulerFaultPoints: true },
);
