import { fileURLToPath } from 'node:url';
import { runConformance } from '@lockkit/conformance';
import { testDatabaseUrl, testPgBouncer } from '@lockkit/test-db';
import { startEmbeddedPostgres } from '@lockkit/test-db/embedded';
import { sql } from 'kysely';
import { kyselyInstance } from './instances.js';

runConformance(
  {
    name: 'kysely on node-postgres',
    databaseUrl: testDatabaseUrl,
    standby: ({ prepare }) => startEmbeddedPostgres({ standby: true, prepare }),
    pgbouncer: testPgBouncer,
    createInstance: ({ url, poolSize, transactionPooler }) =>
      kyselyInstance(url, poolSize, transactionPooler),
    nativeQuery: (trx, text) => sql.raw(text).execute(trx),
    workerModule: fileURLToPath(new URL('./worker-instance.mjs', import.meta.url)),
  },
  { schedulerFaultPoints: true },
);

// Without the pool option, lockkit sees only Kysely's public API: loss is found by asking the
// server, sessions are reset rather than closed. The groups that exercise those paths.
runConformance(
  {
    name: 'kysely without the pool option',
    databaseUrl: testDatabaseUrl,
    createInstance: ({ url, poolSize, transactionPooler }) =>
      kyselyInstance(url, poolSize, transactionPooler, false),
    nativeQuery: (trx, text) => sql.raw(text).execute(trx),
    disable: {
      'truth.pool-of-one-abort':
        'without the pool, lockkit cannot reach the pg connection to send the protocol cancel, and a pool of one has no second connection to cancel from',
      'truth.pool-of-one-nested':
        "without the pool, lockkit cannot read the pool's size, so a nested call on a pool of one is not refused: it waits for the connection the task holds",
    },
  },
  { groups: ['transaction', 'session', 'robustness', 'truth', 'dead-start'] },
);
