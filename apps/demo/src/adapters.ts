/**
 * One lock client per adapter, as a user of each would build it.
 */
import { createRequire } from 'node:module';
import {
  createLockClient,
  type LockClient,
  type LockExecutor,
  type SessionContext,
  type TransactionContext,
} from '@lockkit/core';
import { createLockKit as drizzleKit } from '@lockkit/drizzle';
import { createLockKit as knexKit } from '@lockkit/knex';
import { createLockKit as kyselyKit } from '@lockkit/kysely';
import { createLockKit as pgKit } from '@lockkit/pg';
import { createLockKit as postgresKit } from '@lockkit/postgres';
import { createLockKit as prismaKit } from '@lockkit/prisma';
import { typeormExecutor } from '@lockkit/typeorm';
import { PrismaPg } from '@prisma/adapter-pg';
import { drizzle } from 'drizzle-orm/node-postgres';
import knex from 'knex';
import { Kysely, PostgresDialect } from 'kysely';
import pg from 'pg';
import postgres from 'postgres';
import { DataSource, type EntityManager, type QueryRunner } from 'typeorm';

/** The adapters the demo can run on. */
export const ADAPTERS = [
  'pg',
  'postgres',
  'prisma',
  'drizzle',
  'typeorm',
  'kysely',
  'knex',
] as const;
/** One of {@link ADAPTERS}. */
export type AdapterName = (typeof ADAPTERS)[number];

/** A lock client on `url`, and how to close it. */
export function connect(
  adapter: AdapterName,
  url: string,
  schema: string,
  poolSize = 6,
): { locks: LockClient<unknown, unknown>; close(): Promise<void> } {
  switch (adapter) {
    case 'pg': {
      const pool = new pg.Pool({ connectionString: url, max: poolSize });
      pool.on('error', () => {});
      return {
        locks: pgKit(pool, { schema }) as LockClient<unknown, unknown>,
        close: () => pool.end(),
      };
    }
    case 'postgres': {
      const sql = postgres(url, { max: poolSize, onnotice: () => {} });
      return {
        locks: postgresKit(sql, { schema }) as LockClient<unknown, unknown>,
        close: () => sql.end({ timeout: 5 }),
      };
    }
    case 'drizzle': {
      const pool = new pg.Pool({ connectionString: url, max: poolSize });
      pool.on('error', () => {});
      return {
        locks: drizzleKit(drizzle(pool), { schema }) as LockClient<unknown, unknown>,
        close: () => pool.end(),
      };
    }
    case 'kysely': {
      const pool = new pg.Pool({ connectionString: url, max: poolSize });
      pool.on('error', () => {});
      const db = new Kysely<Record<string, never>>({ dialect: new PostgresDialect({ pool }) });
      return {
        locks: kyselyKit(db, { pool, schema }) as unknown as LockClient<unknown, unknown>,
        close: () => db.destroy(),
      };
    }
    case 'knex': {
      const db = knex({ client: 'pg', connection: url, pool: { min: 0, max: poolSize } });
      return {
        locks: knexKit(db, { schema }) as LockClient<unknown, unknown>,
        close: () => db.destroy(),
      };
    }
    case 'prisma': {
      // The JavaScript flavour of the demo's generated client (prisma/schema.prisma), made by the build.
      const { PrismaClient } = createRequire(import.meta.url)('../generated-js/index.js') as {
        PrismaClient: new (options: {
          adapter: PrismaPg;
        }) => Parameters<typeof prismaKit>[0] & { $disconnect(): Promise<void> };
      };
      const pool = new pg.Pool({ connectionString: url, max: poolSize });
      pool.on('error', () => {});
      const prisma = new PrismaClient({ adapter: new PrismaPg(pool) });
      return {
        locks: prismaKit(prisma, {
          schema,
          timeout: 30_000,
          maxWait: 10_000,
        }) as unknown as LockClient<unknown, unknown>,
        close: async () => {
          await prisma.$disconnect();
          await pool.end();
        },
      };
    }
    case 'typeorm': {
      const dataSource = new DataSource({
        type: 'postgres',
        url,
        poolSize,
        poolErrorHandler: () => {},
      });
      const ready = dataSource.initialize();
      ready.catch(() => {});
      const executor = typeormExecutor(dataSource);
      // connect() is synchronous and initialize() is not: each call waits for it, as a user's
      // code awaits it before its first lockkit call.
      const waiting: LockExecutor<EntityManager, QueryRunner> = Object.freeze({
        name: executor.name,
        singleConnection: executor.singleConnection === true,
        async transaction<T>(fn: (ctx: TransactionContext<EntityManager>) => Promise<T>) {
          await ready;
          return executor.transaction(fn);
        },
        async session<T>(fn: (ctx: SessionContext<QueryRunner>) => Promise<T>) {
          await ready;
          return (executor.session as NonNullable<typeof executor.session>)(fn) as Promise<T>;
        },
      });
      return {
        locks: createLockClient(waiting, { schema }) as LockClient<unknown, unknown>,
        close: async () => {
          await ready.catch(() => {});
          if (dataSource.isInitialized) await dataSource.destroy();
        },
      };
    }
  }
}
