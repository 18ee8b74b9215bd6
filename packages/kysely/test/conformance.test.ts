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
  disable: {
    'pooler.session-refused-when-detected':
      "Kysely does not report the backend pid its pg connection was given at connect (BackendKeyData), which detection compares with pg_backend_pid(): behind a transaction pooler, transactionPooler must be declared (the declared case runs and passes; the README says so)",
  },
});
