// The adapter as a worker process builds it, for the leases and scheduler groups' process cases:
// plain JavaScript over the built package and the JavaScript flavour of the generated client.
import { createRequire } from 'node:module';
import { PrismaPg } from '@prisma/adapter-pg';
import pg from 'pg';
import { prismaExecutor } from '../dist/index.mjs';

const { PrismaClient } = createRequire(import.meta.url)('./generated-js/index.js');

export function createInstance({ url, poolSize, transactionPooler = false }) {
  const pool = new pg.Pool({ connectionString: url, max: poolSize });
  pool.on('error', () => {});
  const prisma = new PrismaClient({ adapter: new PrismaPg(pool) });
  return {
    executor: prismaExecutor(prisma, { transactionPooler, timeout: 20_000, maxWait: 10_000 }),
    close: async () => {
      await prisma.$disconnect();
      await pool.end();
    },
  };
}
