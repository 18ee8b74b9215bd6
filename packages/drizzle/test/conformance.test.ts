import { fileURLToPath } from 'node:url';
import {
  faultPointCaseIds,
  LEASE_FAULT_PROTOCOLS,
  runConformance,
  SCHEDULER_FAULT_OPERATIONS,
  SESSION_FAULT_PROTOCOLS,
  schedulerFaultPointCaseIds,
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

/**
 * The known defect the fault-point group found under postgres.js. Since Drizzle's transactions
 * begin again after a dead start (that second BEGIN takes the stale FATAL) and the sessions'
 * executor reconnects the slot (@lockkit/postgres), these cases all passed unloaded, directly and
 * through PgBouncer (one run each); under stress-ng the session ones failed in 2 runs of 3 (the
 * next caller CONNECTION_LOST at a mid-session boundary): still skipped, as for @lockkit/postgres.
 */
const POSTGRES_JS_STALE_FATAL =
  "known defect: postgres.js hands a terminated backend's FATAL (57P01) to the next query it reconnects for, so the next caller after a backend terminated mid-call can reject CONNECTION_LOST once (the dead-start group, a dead connection lent at a call's start, passes)";

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
      ...faultPointCaseIds(
        ['terminated'],
        [...TRANSACTION_FAULT_PROTOCOLS, ...SESSION_FAULT_PROTOCOLS, ...LEASE_FAULT_PROTOCOLS],
        POSTGRES_JS_STALE_FATAL,
      ),
      ...schedulerFaultPointCaseIds(
        ['terminated'],
        SCHEDULER_FAULT_OPERATIONS,
        POSTGRES_JS_STALE_FATAL,
      ),
      // It ends its own backend five times in a row: @lockkit/postgres measured 3 or 4 runs of 5.
      'scheduler.lease-fenced-write-lost-bounded': POSTGRES_JS_STALE_FATAL,
      'truth.pool-of-one-abort':
        "Drizzle's postgres.js transactions expose no pending query to cancel, and a pool of one has no second connection",
    },
  },
  { schedulerFaultPoints: true },
);
