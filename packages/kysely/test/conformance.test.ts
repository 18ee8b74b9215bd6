import { fileURLToPath } from 'node:url';
import { runConformance } from '@lockkit/conformance';
import { testDatabaseUrl, testPgBouncer } from '@lockkit/test-db';
import { startEmbeddedPostgres } from '@lockkit/test-db/embedded';
import { sql } from 'kysely';
import { kyselyInstance } from './instances.js';

runConformance({
  name: 'kysely on node-postgres',
  databaseUrl: testDatabaseUrl,
  standby: ({ prepare }) => startEmbeddedPostgres({ standby: true, prepare }),
  pgbouncer: testPgBouncer,
  createInstance: ({ url, poolSize, transactionPooler }) =>
    kyselyInstance(url, poolSize, transactionPooler),
  nativeQuery: (trx, text) => sql.raw(text).execute(trx),
  workerModule: fileURLToPath(new URL('./worker-instance.mjs', import.meta.url)),
});
