/**
 * Round trips per decision, counted on the wire: each Postgres path runs once with a free key
 * (run) and once with a key another connection holds (skip), through the counting proxy of
 * `@lockkit/conformance`, on one warmed connection so that connecting is not counted — except that
 * npm advisory-lock opens a new connection for every lock, whose start-up is not in its count.
 * Redis paths are not Postgres wire protocol: their counts come from their protocol
 * (one command per trip), not from the proxy.
 */
import { randomBytes } from 'node:crypto';
import { createRequire } from 'node:module';
import { startRoundTripProxy } from '@lockkit/conformance';
import { generateLockKeys } from '@lockkit/core';
import { createLockKit as createDrizzleLockKit } from '@lockkit/drizzle';
import { createLockKit as createKnexLockKit } from '@lockkit/knex';
import { createLockKit as createKyselyLockKit } from '@lockkit/kysely';
import { createLockKit } from '@lockkit/pg';
import { createLockKit as createPostgresLockKit } from '@lockkit/postgres';
import { createLockKit as createPrismaLockKit } from '@lockkit/prisma';
import { createLockKit as createTypeOrmLockKit } from '@lockkit/typeorm';
import { PrismaPg } from '@prisma/adapter-pg';
import { sql as drizzleSql } from 'drizzle-orm';
import { drizzle } from 'drizzle-orm/node-postgres';
import knex from 'knex';
import { Kysely, sql as kyselySql, PostgresDialect } from 'kysely';
import pg from 'pg';
import postgres from 'postgres';
import { DataSource } from 'typeorm';
import { startPgBossPeer } from './pg-boss.js';
import { PrismaClient } from './prisma-client.js';

/** Run and skip round trips of one path. */
export interface RoundTrips {
  readonly run: number;
  readonly skip: number;
  /** How they were found. */
  readonly counted: 'proxy' | 'protocol';
}

type Decide = (job: string) => Promise<unknown>;

const advisoryLock = (
  createRequire(import.meta.url)('advisory-lock') as {
    default: (url: string) => (name: string) => {
      tryLock(): Promise<(() => Promise<void>) | undefined>;
    };
  }
).default;

/** Counts the round trips of every Postgres path against the server at `url`. */
export async function countRoundTrips(url: string): Promise<Map<string, RoundTrips>> {
  const proxy = await startRoundTripProxy(url);
  const namespace = `rt-${randomBytes(4).toString('hex')}`;
  const holder = new pg.Client({ connectionString: url });
  await holder.connect();
  const pool = new pg.Pool({ connectionString: proxy.url, max: 1 });
  const sql = postgres(proxy.url, { max: 1, onnotice: () => {} });
  const prismaPool = new pg.Pool({ connectionString: proxy.url, max: 1 });
  const prisma = new PrismaClient({ adapter: new PrismaPg(prismaPool) });
  const boss = await startPgBossPeer(proxy.url, 1);
  const typeorm = await new DataSource({
    type: 'postgres',
    url: proxy.url,
    poolSize: 1,
  }).initialize();
  const knexDb = knex({ client: 'pg', connectionPool: pool });
  const results = new Map<string, RoundTrips>();
  try {
    const keys = (job: string) => generateLockKeys(namespace, job);
    const reference: Decide = async (job) => {
      const [k1, k2] = keys(job);
      const conn = await pool.connect();
      try {
        await conn.query('BEGIN');
        await conn.query('SELECT pg_try_advisory_xact_lock($1, $2)', [k1, k2]);
        await conn.query('COMMIT');
      } finally {
        conn.release();
      }
    };
    const handWritten: Decide = async (job) => {
      const [k1, k2] = keys(job);
      const conn = await pool.connect();
      try {
        await conn.query(`BEGIN; SELECT pg_try_advisory_xact_lock(${k1}, ${k2})`);
        await conn.query('COMMIT');
      } finally {
        conn.release();
      }
    };
    const kit = createLockKit(pool);
    const oneTrip = createLockKit(pool, { oneRoundTripSkip: true });
    const pjs = createPostgresLockKit(sql);
    const bareDrizzle = drizzle(pool);
    const dz = createDrizzleLockKit(bareDrizzle);
    const prismaKit = createPrismaLockKit(prisma);
    const bareKysely = new Kysely<Record<string, never>>({
      dialect: new PostgresDialect({ pool }),
    });
    const ky = createKyselyLockKit(bareKysely, { pool });
    const task = async () => {};
    const drizzleReference: Decide = (job) => {
      const [k1, k2] = keys(job);
      return bareDrizzle.transaction((tx) =>
        tx.execute(drizzleSql`SELECT pg_try_advisory_xact_lock(${k1}::int4, ${k2}::int4)`),
      );
    };
    const kyselyReference: Decide = (job) => {
      const [k1, k2] = keys(job);
      return bareKysely
        .transaction()
        .execute((trx) =>
          kyselySql`SELECT pg_try_advisory_xact_lock(${k1}::int4, ${k2}::int4)`.execute(trx),
        );
    };
    const prismaReference: Decide = (job) => {
      const [k1, k2] = keys(job);
      return prisma.$transaction((tx) =>
        tx.$queryRawUnsafe('SELECT pg_try_advisory_xact_lock($1::int4, $2::int4)', k1, k2),
      );
    };
    const typeormKit = createTypeOrmLockKit(typeorm);
    const typeormReference: Decide = (job) => {
      const [k1, k2] = keys(job);
      return typeorm.transaction((manager) =>
        manager.query('SELECT pg_try_advisory_xact_lock($1::int4, $2::int4)', [k1, k2]),
      );
    };
    const knexKit = createKnexLockKit(knexDb);
    const knexReference: Decide = (job) => {
      const [k1, k2] = keys(job);
      return knexDb.transaction((trx) =>
        trx.raw('SELECT pg_try_advisory_xact_lock(?::int4, ?::int4)', [k1, k2]),
      );
    };
    const paths: [string, Decide][] = [
      ['seed reference', reference],
      ['hand-written 2-trip', handWritten],
      ['@lockkit/pg', (job) => kit.runExclusiveJob(namespace, job, task)],
      ['@lockkit/pg oneRoundTripSkip', (job) => oneTrip.runExclusiveJob(namespace, job, task)],
      ['@lockkit/postgres', (job) => pjs.runExclusiveJob(namespace, job, task)],
      ['@lockkit/drizzle (node-postgres)', (job) => dz.runExclusiveJob(namespace, job, task)],
      ['drizzle (node-postgres) transaction', drizzleReference],
      ['@lockkit/prisma', (job) => prismaKit.runExclusiveJob(namespace, job, task)],
      ['prisma $transaction', prismaReference],
      ['@lockkit/typeorm', (job) => typeormKit.runExclusiveJob(namespace, job, task)],
      ['typeorm transaction', typeormReference],
      ['@lockkit/kysely (node-postgres)', (job) => ky.runExclusiveJob(namespace, job, task)],
      ['kysely (node-postgres) transaction', kyselyReference],
      ['@lockkit/knex', (job) => knexKit.runExclusiveJob(namespace, job, task)],
      ['knex transaction', knexReference],
    ];
    const [h1, h2] = keys('held');
    await holder.query('SELECT pg_advisory_lock($1::int4, $2::int4)', [h1, h2]);
    const count = async (decide: Decide, job: string) => {
      const before = proxy.roundTrips();
      await decide(job);
      return proxy.roundTrips() - before;
    };
    for (const [name, decide] of paths) {
      await decide('warm'); // connect outside the count
      results.set(name, {
        run: await count(decide, `free-${name}`),
        skip: await count(decide, 'held'),
        counted: 'proxy',
      });
    }
    // advisory-lock opens its own connection per lock: its statements are counted, not the start-up.
    const mutex = advisoryLock(proxy.url);
    const adv = async (job: string) => {
      const unlock = await mutex(`${namespace}-${job}`).tryLock();
      await unlock?.();
    };
    const advHolder = await mutex(`${namespace}-adv-held`).tryLock();
    results.set('npm advisory-lock', {
      run: await count(adv, 'adv-free'),
      skip: await count(adv, 'adv-held'),
      counted: 'proxy',
    });
    await advHolder?.();
    // pg-boss: a skip is `send` refused because the job already waits in the queue.
    await boss.cycle(0); // warm
    const bossRun = await count(() => boss.cycle(0), 'unused');
    await boss.park(0);
    results.set('pg-boss 10 singleton job', {
      run: bossRun,
      skip: await count(() => boss.cycle(0), 'unused'),
      counted: 'proxy',
    });
    results.set('Redis SET NX PX + Lua release', { run: 2, skip: 1, counted: 'protocol' });
    results.set('node-redlock 4', { run: 2, skip: 1, counted: 'protocol' });
    return results;
  } finally {
    await boss.close();
    await typeorm.destroy();
    await knexDb.destroy();
    await prisma.$disconnect();
    await prismaPool.end();
    await pool.end();
    await sql.end({ timeout: 5 });
    await holder.end();
    await proxy.close();
  }
}
