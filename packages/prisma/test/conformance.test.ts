import { fileURLToPath } from 'node:url';
import { runConformance } from '@lockkit/conformance';
import { testDatabaseUrl, testPgBouncer } from '@lockkit/test-db';
import { prismaInstance } from './instances.js';

runConformance({
  name: 'prisma (adapter-pg)',
  databaseUrl: testDatabaseUrl,
  pgbouncer: testPgBouncer,
  createInstance: ({ url, poolSize, transactionPooler }) =>
    prismaInstance(url, poolSize, { transactionPooler: transactionPooler ?? false }),
  nativeQuery: (tx, text) => tx.$executeRawUnsafe(text),
  workerModule: fileURLToPath(new URL('./worker-instance.mjs', import.meta.url)),
});
