/**
 * The bench's Prisma client: the JavaScript flavour of a client generated from
 * `prisma/schema.prisma` by the build, typed here by the part of it the bench uses.
 */
import { createRequire } from 'node:module';
import type { PrismaPg } from '@prisma/adapter-pg';

/** The part of Prisma's transaction client the bench uses. */
export interface BenchPrismaTransaction {
  $queryRawUnsafe<T>(q: string, ...v: unknown[]): Promise<T>;
}

/** The part of `PrismaClient` the bench uses. */
export interface BenchPrismaClient {
  $transaction<R>(
    fn: (tx: BenchPrismaTransaction) => Promise<R>,
    o?: { timeout?: number; maxWait?: number },
  ): Promise<R>;
  $queryRawUnsafe<T>(q: string, ...v: unknown[]): Promise<T>;
  $disconnect(): Promise<void>;
}

/** The generated `PrismaClient` class, over a driver adapter. */
export const { PrismaClient } = createRequire(import.meta.url)('../generated-js/index.js') as {
  PrismaClient: new (options: { adapter: PrismaPg }) => BenchPrismaClient;
};
