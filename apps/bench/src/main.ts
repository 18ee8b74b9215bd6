/**
 * `pnpm bench`: runExclusiveJob through @lockkit/pg and @lockkit/postgres against the seed's reference implementation
 * (pool.connect, BEGIN, try-lock, COMMIT: 3 round trips) and a `SELECT 1` floor, at 1 and 16
 * concurrent clients, in the same run. Scenarios are interleaved over several rounds so that
 * drift in CPU placement hits them all alike; ratios are what to compare across machines.
 *
 * DATABASE_URL selects the server (else an embedded PostgreSQL is started).
 * LOCKKIT_BENCH_MS sets the time per scenario per round (default 1500), LOCKKIT_BENCH_ROUNDS the
 * rounds (default 3).
 */
import { randomBytes } from 'node:crypto';
import { createRequire } from 'node:module';
import { generateLockKeys } from '@lockkit/core';
import { createLockKit as createDrizzleLockKit } from '@lockkit/drizzle';
import { createLockKit } from '@lockkit/pg';
import { createLockKit as createPostgresLockKit } from '@lockkit/postgres';
import { createLockKit as createPrismaLockKit } from '@lockkit/prisma';
import { startEmbeddedPostgres } from '@lockkit/test-db/embedded';
import { PrismaPg } from '@prisma/adapter-pg';
import { drizzle as drizzleNodePostgres } from 'drizzle-orm/node-postgres';
import { drizzle as drizzlePostgresJs } from 'drizzle-orm/postgres-js';
import pg from 'pg';
import postgres from 'postgres';
import { combine, type Measurement, measure, type Operation, percentile } from './measure.js';

// The JavaScript flavour of a generated client (prisma/schema.prisma), made by the build.
const { PrismaClient } = createRequire(import.meta.url)('../generated-js/index.js') as {
  PrismaClient: new (options: {
    adapter: PrismaPg;
  }) => {
    $transaction<R>(
      fn: (tx: { $queryRawUnsafe<T>(q: string, ...v: unknown[]): Promise<T> }) => Promise<R>,
      o?: { timeout?: number; maxWait?: number },
    ): Promise<R>;
    $queryRawUnsafe<T>(q: string, ...v: unknown[]): Promise<T>;
    $disconnect(): Promise<void>;
  };
};

const ms = Number(process.env.LOCKKIT_BENCH_MS ?? 1500);
const rounds = Number(process.env.LOCKKIT_BENCH_ROUNDS ?? 3);
const clientCounts = (process.env.LOCKKIT_BENCH_CLIENTS ?? '1,16').split(',').map(Number);

interface Scenario {
  readonly name: string;
  readonly operation: Operation;
}

async function main(): Promise<void> {
  const embedded = process.env.DATABASE_URL ? undefined : await startEmbeddedPostgres();
  const url = process.env.DATABASE_URL ?? (embedded?.url as string);
  const namespace = `bench-${randomBytes(4).toString('hex')}`;
  const lines: string[] = [];
  try {
    for (const clients of clientCounts) {
      const pool = new pg.Pool({ connectionString: url, max: clients });
      pool.on('error', () => {});
      const locks = createLockKit(pool);
      const sql = postgres(url, { max: clients, onnotice: () => {} });
      const pjsLocks = createPostgresLockKit(sql);
      const drizzlePgLocks = createDrizzleLockKit(drizzleNodePostgres(pool));
      const prismaPool = new pg.Pool({ connectionString: url, max: clients });
      prismaPool.on('error', () => {});
      const prisma = new PrismaClient({ adapter: new PrismaPg(prismaPool) });
      const prismaLocks = createPrismaLockKit(prisma);
      const drizzlePjsLocks = createDrizzleLockKit(drizzlePostgresJs(sql));
      // Every client has its own job, so each decision is a run; the skip scenario uses jobs that
      // a separate connection holds for the whole scenario.
      const runJobs = Array.from({ length: clients }, (_, i) => `run-${i}`);
      const skipJobs = Array.from({ length: clients }, (_, i) => `skip-${i}`);
      const holder = new pg.Client({ connectionString: url });
      await holder.connect();
      for (const job of skipJobs) {
        const [k1, k2] = generateLockKeys(namespace, job);
        await holder.query('SELECT pg_advisory_lock($1::int4, $2::int4)', [k1, k2]);
      }
      const referenceKeys = runJobs.map((job) => generateLockKeys(`${namespace}-ref`, job));
      const scenarios: Scenario[] = [
        { name: 'floor: pg SELECT 1', operation: () => pool.query('SELECT 1') },
        {
          name: 'seed reference (connect, BEGIN, try-lock, COMMIT)',
          operation: async (client) => {
            const conn = await pool.connect();
            try {
              await conn.query('BEGIN');
              const [k1, k2] = referenceKeys[client] as [number, number];
              await conn.query('SELECT pg_try_advisory_xact_lock($1, $2)', [k1, k2]);
              await conn.query('COMMIT');
            } finally {
              conn.release();
            }
          },
        },
        {
          name: 'hand-written: BEGIN+try-lock in one query, COMMIT',
          operation: async (client) => {
            const conn = await pool.connect();
            try {
              const [k1, k2] = referenceKeys[client] as [number, number];
              await conn.query(`BEGIN; SELECT pg_try_advisory_xact_lock(${k1}, ${k2})`);
              await conn.query('COMMIT');
            } finally {
              conn.release();
            }
          },
        },
        {
          name: 'lockkit runExclusiveJob, run decision',
          operation: (client) =>
            locks.runExclusiveJob(namespace, runJobs[client] as string, async () => {}),
        },
        {
          name: 'lockkit runExclusiveJob, skip decision',
          operation: (client) =>
            locks.runExclusiveJob(namespace, skipJobs[client] as string, async () => {}),
        },
        {
          name: 'lockkit runExclusiveJob, one hot key',
          operation: () => locks.runExclusiveJob(namespace, 'hot', async () => {}),
        },
        {
          name: 'postgres.js sql.begin reference (BEGIN awaited, try-lock, COMMIT)',
          operation: (client) => {
            const [k1, k2] = referenceKeys[client] as [number, number];
            return sql.begin((tx) => tx`SELECT pg_try_advisory_xact_lock(${k1}, ${k2})`);
          },
        },
        {
          name: '@lockkit/postgres runExclusiveJob, run decision',
          operation: (client) =>
            pjsLocks.runExclusiveJob(namespace, `pjs-${runJobs[client]}`, async () => {}),
        },
        {
          name: '@lockkit/postgres runExclusiveJob, skip decision',
          operation: (client) =>
            pjsLocks.runExclusiveJob(namespace, skipJobs[client] as string, async () => {}),
        },
        {
          name: '@lockkit/drizzle (node-postgres) runExclusiveJob, run decision',
          operation: (client) =>
            drizzlePgLocks.runExclusiveJob(namespace, `dpg-${runJobs[client]}`, async () => {}),
        },
        {
          name: 'prisma $transaction reference (try-lock, no lockkit)',
          operation: (client) => {
            const [k1, k2] = referenceKeys[client] as [number, number];
            return prisma.$transaction((tx) =>
              tx.$queryRawUnsafe('SELECT pg_try_advisory_xact_lock($1::int4, $2::int4)', k1, k2),
            );
          },
        },
        {
          name: '@lockkit/prisma runExclusiveJob, run decision',
          operation: (client) =>
            prismaLocks.runExclusiveJob(namespace, `prisma-${runJobs[client]}`, async () => {}),
        },
        {
          name: '@lockkit/drizzle (postgres.js) runExclusiveJob, run decision',
          operation: (client) =>
            drizzlePjsLocks.runExclusiveJob(namespace, `dpjs-${runJobs[client]}`, async () => {}),
        },
      ];
      // Sanity: the skip scenario skips and the run scenario runs.
      const probeRun = await locks.runExclusiveJob(namespace, runJobs[0] as string, async () => 1);
      const probeSkip = await locks.runExclusiveJob(
        namespace,
        skipJobs[0] as string,
        async () => 1,
      );
      const pjsSkip = await pjsLocks.runExclusiveJob(
        namespace,
        skipJobs[0] as string,
        async () => 1,
      );
      if (!probeRun.executed || probeSkip.executed || pjsSkip.executed) {
        throw new Error('bench scenarios are not what they claim');
      }
      for (const s of scenarios) await measure(s.operation, clients, 200); // warm-up
      const runs = new Map<string, Measurement[]>(scenarios.map((s) => [s.name, []]));
      for (let round = 0; round < rounds; round++) {
        for (const s of scenarios) runs.get(s.name)?.push(await measure(s.operation, clients, ms));
      }
      await holder.end();
      await pool.end();
      await sql.end({ timeout: 5 });
      await prisma.$disconnect();
      await prismaPool.end();
      const results = scenarios.map((s) => ({ name: s.name, m: combine(runs.get(s.name) ?? []) }));
      const opsPerSecond = (m: Measurement) => m.operations / m.seconds;
      const floor = opsPerSecond((results[0] as { m: Measurement }).m);
      const reference = opsPerSecond((results[1] as { m: Measurement }).m);
      for (const { name, m } of results) {
        const ops = opsPerSecond(m);
        lines.push(
          `| ${clients} | ${name} | ${Math.round(ops)} | ${percentile(m.latenciesMs, 50).toFixed(3)} | ${percentile(m.latenciesMs, 99).toFixed(3)} | ${(ops / floor).toFixed(2)} | ${(ops / reference).toFixed(2)} |`,
        );
      }
    }
  } finally {
    await embedded?.stop();
  }
  const server = process.env.DATABASE_URL ? 'DATABASE_URL server' : 'embedded PostgreSQL';
  console.log(
    `\nlockkit bench — ${server}, ${rounds} rounds × ${ms} ms per scenario, node ${process.version}\n`,
  );
  console.log('| clients | path | ops/s | p50 ms | p99 ms | × floor | × reference |');
  console.log('|---|---|---|---|---|---|---|');
  for (const line of lines) console.log(line);
}

main().catch((error: unknown) => {
  console.error(error);
  process.exitCode = 1;
});
