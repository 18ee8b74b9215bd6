import { fileURLToPath } from 'node:url';
import { runConformance } from '@lockkit/conformance';
import { testDatabaseUrl, testPgBouncer } from '@lockkit/test-db';
import { startEmbeddedPostgres } from '@lockkit/test-db/embedded';
import { prismaInstance } from './instances.js';

runConformance(
  {
    name: 'prisma (adapter-pg)',
    databaseUrl: testDatabaseUrl,
    standby: ({ prepare }) => startEmbeddedPostgres({ standby: true, prepare }),
    pgbouncer: testPgBouncer,
    createInstance: ({ url, poolSize, transactionPooler }) =>
      prismaInstance(url, poolSize, { transactionPooler: transactionPooler ?? false }),
    nativeQuery: (tx, text) => tx.$executeRawUnsafe(text),
    workerModule: fileURLToPath(new URL('./worker-instance.mjs', import.meta.url)),
    disable: {
      'truth.pool-of-one-abort':
        "Prisma lends no connection to cancel on, and a pool of one has no second one: a wait there ends at Prisma's own timeout or when the holder lets go",
      'truth.pool-of-one-nested':
        "Prisma does not show lockkit the size of its driver adapter's pool, so a nested call on a pool of one is not refused: it waits for the connection the task holds until Prisma's own transaction limits give up",
    },
  },
  { schedulerFaultPoints: true },
);
