import { fileURLToPath } from 'node:url';
import {
  faultPointCaseIds,
  runConformance,
  SESSION_FAULT_PROTOCOLS,
  TRANSACTION_FAULT_PROTOCOLS,
} from '@lockkit/conformance';
import { testDatabaseUrl, testPgBouncer } from '@lockkit/test-db';
import { startEmbeddedPostgres } from '@lockkit/test-db/embedded';
import { sql } from 'drizzle-orm';
import {
  nodePostgresClientInstance,
  nodePostgresInstance,
  postgresJsInstance,
} from './instances.js';

/** The known defect the fault-point group found under Drizzle on node-postgres. */
const DRIZZLE_PG_BEGIN_LEAK =
  "known defect: drizzle-orm's node-postgres transaction() never releases its pool client when BEGIN fails on a lost link (BEGIN is outside its try/finally)";

/** The known defect the fault-point group found under postgres.js. */
const POSTGRES_JS_STALE_FATAL =
  "known defect: postgres.js hands a terminated backend's FATAL (57P01) to the next query it reconnects for, so the next caller after a terminated backend rejects CONNECTION_LOST once";

const worker = (name: string) => fileURLToPath(new URL(`./worker-${name}.mjs`, import.meta.url));

runConformance({
  name: 'drizzle on node-postgres',
  databaseUrl: testDatabaseUrl,
  // Known defect, found by the fault-point group and not fixed yet: drizzle-orm's node-postgres
  // `transaction()` sends BEGIN outside its try/finally, so a link lost (or a backend terminated)
  // under BEGIN never gives the pool client back: a pool of one is then wedged. Shown by
  // runExclusiveJob's cases, run as expected failures; the same defect's other cases are skipped
  // visibly (each costs seconds of waiting for the leaked connection).
  expectedFailures: faultPointCaseIds(
    ['drop-before', 'drop-after'],
    ['run-exclusive-job'],
    DRIZZLE_PG_BEGIN_LEAK,
  ),
  disable: {
    ...faultPointCaseIds(
      ['drop-before', 'drop-after'],
      TRANSACTION_FAULT_PROTOCOLS.filter((p) => p !== 'run-exclusive-job'),
      `${DRIZZLE_PG_BEGIN_LEAK} (shown by the expected failures of faults.run-exclusive-job)`,
    ),
    // Direct, a backend terminated under BEGIN hits the same leak; through PgBouncer the
    // pooler absorbs it and the case passes: one declaration cannot say both, so it is skipped.
    ...faultPointCaseIds(
      ['terminated'],
      TRANSACTION_FAULT_PROTOCOLS,
      `${DRIZZLE_PG_BEGIN_LEAK} (direct: a backend terminated under BEGIN leaks the same way; through PgBouncer it passes)`,
    ),
    'truth.lost-opening-is-typed': `${DRIZZLE_PG_BEGIN_LEAK} (shown by the expected failures of faults.run-exclusive-job; here the fixture's pool could never close)`,
  },
  standby: ({ prepare }) => startEmbeddedPostgres({ standby: true, prepare }),
  pgbouncer: testPgBouncer,
  createInstance: ({ url, poolSize, transactionPooler }) =>
    nodePostgresInstance(url, poolSize, transactionPooler),
  nativeQuery: (tx, text) => tx.execute(sql.raw(text)),
  singleConnection: async (url) => (await nodePostgresClientInstance(url)) as never,
  workerModule: worker('node-postgres'),
});

runConformance({
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
    ...faultPointCaseIds(
      ['terminated'],
      [...TRANSACTION_FAULT_PROTOCOLS, ...SESSION_FAULT_PROTOCOLS],
      POSTGRES_JS_STALE_FATAL,
    ),
    'truth.pool-of-one-abort':
      "Drizzle's postgres.js transactions expose no pending query to cancel, and a pool of one has no second connection",
  },
});
