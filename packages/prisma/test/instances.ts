/**
 * Prisma clients for the tests, from the generated client of test/prisma/schema.prisma over
 * `@prisma/adapter-pg` with a pool the test owns (so that checked-out connections can be counted).
 */
import { PrismaPg } from '@prisma/adapter-pg';
import pg from 'pg';
import { createLockKit, type PrismaExecutorOptions, prismaExecutor } from '../src/index.js';
import { PrismaClient } from './generated/client.js';

export function prismaInstance(url: string, poolSize: number, options: PrismaExecutorOptions = {}) {
  const pool = new pg.Pool({ connectionString: url, max: poolSize });
  pool.on('error', () => {});
  const prisma = new PrismaClient({ adapter: new PrismaPg(pool) });
  return {
    prisma,
    pool,
    executor: prismaExecutor(prisma, { timeout: 20_000, maxWait: 10_000, ...options }),
    locks: (extra: PrismaExecutorOptions = {}) =>
      createLockKit(prisma, { timeout: 20_000, maxWait: 10_000, ...options, ...extra }),
    checkedOut: () => pool.totalCount - pool.idleCount,
    close: async () => {
      await prisma.$disconnect();
      await pool.end();
    },
  };
}
