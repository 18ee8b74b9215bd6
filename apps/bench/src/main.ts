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
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { generateLockKeys } from '@lockkit/core';
import { createLockKit as createDrizzleLockKit } from '@lockkit/drizzle';
import { createLockKit as createKnexLockKit } from '@lockkit/knex';
import { createLockKit as createKyselyLockKit } from '@lockkit/kysely';
import { createLockKit } from '@lockkit/pg';
import { createLockKit as createPostgresLockKit } from '@lockkit/postgres';
import { createLockKit as createPrismaLockKit } from '@lockkit/prisma';
import { startEmbeddedPostgres } from '@lockkit/test-db/embedded';
import { createLockKit as createTypeOrmLockKit } from '@lockkit/typeorm';
import { PrismaPg } from '@prisma/adapter-pg';
import { sql as drizzleSql } from 'drizzle-orm';
import { drizzle as drizzleNodePostgres } from 'drizzle-orm/node-postgres';
import { drizzle as drizzlePostgresJs } from 'drizzle-orm/postgres-js';
import { Redis } from 'ioredis';
import knex from 'knex';
import { Kysely, sql as kyselySql, PostgresDialect } from 'kysely';
import pg from 'pg';
import postgres from 'postgres';
import { DataSource } from 'typeorm';
import { measureJsCost } from './js-cost.js';
import { measureRenewalLatency } from './lease-renewal.js';
import { type Measurement, measure, median, type Operation, percentile } from './measure.js';
import { type MemoryReport, measureMemory, type ProcessMemory } from './memory.js';
import { startPgBossPeer } from './pg-boss.js';
import { isLocalUrl, type Pinning, pinApart } from './pinning.js';
import { PrismaClient } from './prisma-client.js';
import { countRoundTrips, type RoundTrips } from './round-trips.js';
import {
  type ClaimModelReport,
  type ClaimRun,
  measureCeiling,
  measureClaimModel,
  measureScale,
  type ScaleDistribution,
  type ScaleReport,
} from './scale.js';

// node-redlock 4 ships no types: the part of it the bench uses.
const Redlock = createRequire(import.meta.url)('redlock') as new (
  clients: Redis[],
  options: { retryCount: number },
) => { lock(resource: string, ttlMs: number): Promise<{ unlock(): Promise<unknown> }> };

// npm advisory-lock is CommonJS with `exports.default`: the part of it the bench uses.
const advisoryLock = (
  createRequire(import.meta.url)('advisory-lock') as {
    default: (url: string) => (name: string) => {
      tryLock(): Promise<(() => Promise<void>) | undefined>;
    };
  }
).default;

/** Redis on this machine, or the reason the Redis rows are left out. */
async function connectRedis(): Promise<Redis | string> {
  const url = process.env.LOCKKIT_BENCH_REDIS_URL ?? 'redis://127.0.0.1:6379';
  const redis = new Redis(url, {
    lazyConnect: true,
    maxRetriesPerRequest: 1,
    connectTimeout: 1000,
  });
  redis.on('error', () => {});
  try {
    await redis.connect();
    await redis.ping();
    return redis;
  } catch (error) {
    redis.disconnect();
    return `no Redis answered at ${url} (${(error as Error).message})`;
  }
}

/** Releases a Redis lock only if it is still ours. */
const RELEASE =
  "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";

const { values: flags } = parseArgs({
  options: {
    quick: { type: 'boolean', default: false },
    json: { type: 'boolean', default: false },
    // The scale run: 8 processes × 1,000 per-second jobs for 30 s (--quick: 2 × 100 for 5 s).
    scale: { type: 'boolean', default: false },
    // --scale: which instances decide each tick (the scheduler's `distribution` option).
    distribution: { type: 'string', default: 'every-instance' },
    // Only the lease renewal latency with 0 and 16 contenders on the same lease.
    'lease-renewal': { type: 'boolean', default: false },
    // Only lockkit's own JavaScript per decision, over a driver that answers at once.
    'js-cost': { type: 'boolean', default: false },
    // Only the memory probes (bare, 16 connections, 10,000 jobs on one and on distinct schedules).
    memory: { type: 'boolean', default: false },
    // Only the scheduler at scale: the server's ceiling, then 1, 4, 8 processes × 100, 1,000 jobs.
    'scale-matrix': { type: 'boolean', default: false },
  },
});
// --quick: a few seconds per case, for a look; the table's ratios are then rough.
const ms = Number(process.env.LOCKKIT_BENCH_MS ?? (flags.quick ? 300 : 1500));
const rounds = Number(process.env.LOCKKIT_BENCH_ROUNDS ?? (flags.quick ? 1 : 3));
const clientCounts = (process.env.LOCKKIT_BENCH_CLIENTS ?? '1,16').split(',').map(Number);

interface Scenario {
  readonly name: string;
  readonly operation: Operation;
}

/** Which path, and which decision, each row measures: for `--json`. */
const ROWS: Record<string, { readonly path: string; readonly kind: 'run' | 'skip' | 'hot' }> = {
  'seed reference (connect, BEGIN, try-lock, COMMIT)': { path: 'seed reference', kind: 'run' },
  'hand-written: BEGIN+try-lock in one query, COMMIT': { path: 'hand-written 2-trip', kind: 'run' },
  'lockkit runExclusiveJob, run decision': { path: '@lockkit/pg', kind: 'run' },
  'lockkit runExclusiveJob, skip decision': { path: '@lockkit/pg', kind: 'skip' },
  'lockkit runExclusiveJob, one hot key': { path: '@lockkit/pg', kind: 'hot' },
  'lockkit oneRoundTripSkip, skip decision': { path: '@lockkit/pg oneRoundTripSkip', kind: 'skip' },
  'lockkit oneRoundTripSkip, one hot key': { path: '@lockkit/pg oneRoundTripSkip', kind: 'hot' },
  'npm advisory-lock tryLock + unlock (a connection per lock)': {
    path: 'npm advisory-lock',
    kind: 'run',
  },
  'Redis SET NX PX + Lua release, run decision': {
    path: 'Redis SET NX PX + Lua release',
    kind: 'run',
  },
  'Redis SET NX PX, one hot key': { path: 'Redis SET NX PX + Lua release', kind: 'hot' },
  'node-redlock 4 lock + unlock, run decision': { path: 'node-redlock 4', kind: 'run' },
  'node-redlock 4, one hot key': { path: 'node-redlock 4', kind: 'hot' },
  '@lockkit/postgres runExclusiveJob, run decision': { path: '@lockkit/postgres', kind: 'run' },
  '@lockkit/postgres runExclusiveJob, skip decision': { path: '@lockkit/postgres', kind: 'skip' },
  '@lockkit/drizzle (node-postgres) runExclusiveJob, run decision': {
    path: '@lockkit/drizzle (node-postgres)',
    kind: 'run',
  },
  'drizzle (node-postgres) transaction reference (try-lock, no lockkit)': {
    path: 'drizzle (node-postgres) transaction',
    kind: 'run',
  },
  'drizzle (postgres.js) transaction reference (try-lock, no lockkit)': {
    path: 'drizzle (postgres.js) transaction',
    kind: 'run',
  },
  '@lockkit/drizzle (postgres.js) runExclusiveJob, run decision': {
    path: '@lockkit/drizzle (postgres.js)',
    kind: 'run',
  },
  'knex transaction reference (try-lock, no lockkit)': {
    path: 'knex transaction',
    kind: 'run',
  },
  '@lockkit/knex runExclusiveJob, run decision': { path: '@lockkit/knex', kind: 'run' },
  'prisma $transaction reference (try-lock, no lockkit)': {
    path: 'prisma $transaction',
    kind: 'run',
  },
  '@lockkit/prisma runExclusiveJob, run decision': { path: '@lockkit/prisma', kind: 'run' },
  'typeorm dataSource.transaction reference (try-lock, no lockkit)': {
    path: 'typeorm transaction',
    kind: 'run',
  },
  '@lockkit/typeorm runExclusiveJob, run decision': { path: '@lockkit/typeorm', kind: 'run' },
  'kysely (node-postgres) transaction reference (try-lock, no lockkit)': {
    path: 'kysely (node-postgres) transaction',
    kind: 'run',
  },
  '@lockkit/kysely (node-postgres) runExclusiveJob, run decision': {
    path: '@lockkit/kysely (node-postgres)',
    kind: 'run',
  },
  'pg-boss 10 singleton job cycle (send, fetch, complete)': {
    path: 'pg-boss 10 singleton job',
    kind: 'run',
  },
  'pg-boss 10 singleton job, one hot queue': { path: 'pg-boss 10 singleton job', kind: 'hot' },
};

/** Client and servers on different CPUs for the 1-client rows, where this machine allows it. */
async function pinForOneClient(url: string): Promise<Pinning> {
  const redis = await connectRedis();
  let redisPid: number | undefined;
  if (typeof redis !== 'string') {
    const info = await redis.info('server');
    redisPid = Number(/^process_id:(\d+)/m.exec(info)?.[1]) || undefined;
    redis.disconnect();
  }
  // A backend of the server, alive while pinning: its parent is the postmaster.
  const probe = new pg.Client({ connectionString: url });
  await probe.connect();
  try {
    const { rows } = await probe.query<{ pid: number }>('SELECT pg_backend_pid() AS pid');
    return pinApart({ postgresBackendPid: rows[0]?.pid, postgresLocal: isLocalUrl(url), redisPid });
  } finally {
    await probe.end();
  }
}

async function main(): Promise<void> {
  if (flags['js-cost']) {
    const rows = await measureJsCost();
    const builds = Object.keys(rows[0]?.microseconds ?? {});
    console.log(
      `\nlockkit's JavaScript per decision, @lockkit/pg over a driver that answers at once (µs, median of 7 rounds × 20,000)\n`,
    );
    console.log(`| row | ${builds.join(' | ')} |`);
    console.log(`|---|${builds.map(() => '---').join('|')}|`);
    for (const r of rows)
      console.log(`| ${r.row} | ${builds.map((b) => r.microseconds[b]?.toFixed(2)).join(' | ')} |`);
    if (flags.json) console.log(JSON.stringify({ jsCost: rows }));
    return;
  }
  const embedded = process.env.DATABASE_URL ? undefined : await startEmbeddedPostgres();
  const url = process.env.DATABASE_URL ?? (embedded?.url as string);
  if (flags['lease-renewal']) {
    try {
      await leaseRenewal(url);
    } finally {
      await embedded?.stop();
    }
    return;
  }
  if (flags['scale-matrix']) {
    try {
      await scaleMatrix(url);
    } finally {
      await embedded?.stop();
    }
    return;
  }
  if (flags.memory) {
    try {
      const memory = measureMemory(
        url,
        fileURLToPath(new URL('./memory-probe.mjs', import.meta.url)),
      );
      printMemory(memory);
      if (flags.json) console.log(JSON.stringify({ memory }));
    } finally {
      await embedded?.stop();
    }
    return;
  }
  const namespace = `bench-${randomBytes(4).toString('hex')}`;
  const lines: string[] = [];
  const notes = new Set<string>();
  /** × floor per path and decision, by client count: for `--json`. */
  const ratios = new Map<string, Record<string, number>>();
  let roundTrips = new Map<string, RoundTrips>();
  let memory: ReturnType<typeof measureMemory> | undefined;
  let scale: ScaleReport | undefined;
  let pinning: Pinning | undefined;
  try {
    roundTrips = await countRoundTrips(url);
    memory = measureMemory(url, fileURLToPath(new URL('./memory-probe.mjs', import.meta.url)));
    if (flags.scale) {
      const worker = fileURLToPath(new URL('./scale-worker.mjs', import.meta.url));
      const distribution = scaleDistribution(flags.distribution);
      scale = flags.quick
        ? await measureScale(url, worker, 2, 100, 5, distribution)
        : await measureScale(url, worker, 8, 1000, 30, distribution);
    }
    for (const clients of clientCounts) {
      if (clients === 1) {
        pinning = await pinForOneClient(url);
        notes.add(pinning.note);
      }
      const pool = new pg.Pool({ connectionString: url, max: clients });
      pool.on('error', () => {});
      const locks = createLockKit(pool);
      const oneTripLocks = createLockKit(pool, { oneRoundTripSkip: true });
      const redis = await connectRedis();
      if (typeof redis === 'string') notes.add(`Redis rows left out: ${redis}`);
      const redlock =
        typeof redis === 'string' ? undefined : new Redlock([redis], { retryCount: 0 });
      const redisPrefix = `lockkit-bench-${randomBytes(4).toString('hex')}`;
      const createMutex = advisoryLock(url);
      const sql = postgres(url, { max: clients, onnotice: () => {} });
      const pjsLocks = createPostgresLockKit(sql);
      const drizzlePgLocks = createDrizzleLockKit(drizzleNodePostgres(pool));
      const tryLockSql = (client: number) => {
        const [k1, k2] = referenceKeys[client] as [number, number];
        return drizzleSql`SELECT pg_try_advisory_xact_lock(${k1}::int4, ${k2}::int4)`;
      };
      const prismaPool = new pg.Pool({ connectionString: url, max: clients });
      prismaPool.on('error', () => {});
      const prisma = new PrismaClient({ adapter: new PrismaPg(prismaPool) });
      const prismaLocks = createPrismaLockKit(prisma);
      const drizzlePg = drizzleNodePostgres(pool);
      const drizzlePjs = drizzlePostgresJs(sql);
      const drizzlePjsLocks = createDrizzleLockKit(drizzlePjs);
      const typeorm = await new DataSource({
        type: 'postgres',
        url,
        poolSize: clients,
      }).initialize();
      const typeormLocks = createTypeOrmLockKit(typeorm);
      const kyselyPg = new Kysely<Record<string, never>>({
        dialect: new PostgresDialect({ pool }),
      });
      const kyselyPgLocks = createKyselyLockKit(kyselyPg, { pool });
      // Knex over the same pg.Pool (connectionPool, Knex 3.3): no more connections for its rows.
      const knexDb = knex({ client: 'pg', connectionPool: pool });
      const knexLocks = createKnexLockKit(knexDb);
      const boss = await startPgBossPeer(url, clients);
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
          name: 'lockkit oneRoundTripSkip, skip decision',
          operation: (client) =>
            oneTripLocks.runExclusiveJob(namespace, skipJobs[client] as string, async () => {}),
        },
        {
          name: 'lockkit oneRoundTripSkip, one hot key',
          operation: () => oneTripLocks.runExclusiveJob(namespace, 'hot', async () => {}),
        },
        {
          name: 'npm advisory-lock tryLock + unlock (a connection per lock)',
          operation: async (client) => {
            const unlock = await createMutex(`${namespace}-adv-${client}`).tryLock();
            await unlock?.();
          },
        },
        ...(typeof redis === 'string' || !redlock
          ? []
          : [
              {
                name: 'Redis SET NX PX + Lua release, run decision',
                operation: async (client: number) => {
                  const key = `${redisPrefix}:run:${client}`;
                  if ((await redis.set(key, 'me', 'PX', 10_000, 'NX')) === 'OK')
                    await redis.eval(RELEASE, 1, key, 'me');
                },
              },
              {
                name: 'Redis SET NX PX, one hot key',
                operation: async () => {
                  const key = `${redisPrefix}:hot`;
                  if ((await redis.set(key, 'me', 'PX', 10_000, 'NX')) === 'OK')
                    await redis.eval(RELEASE, 1, key, 'me');
                },
              },
              {
                name: 'node-redlock 4 lock + unlock, run decision',
                operation: async (client: number) => {
                  const lock = await redlock.lock(`${redisPrefix}:redlock:${client}`, 10_000);
                  await lock.unlock();
                },
              },
              {
                name: 'node-redlock 4, one hot key',
                operation: async () => {
                  const lock = await redlock
                    .lock(`${redisPrefix}:redlock:hot`, 10_000)
                    .catch(() => undefined);
                  await lock?.unlock();
                },
              },
            ]),
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
          name: 'drizzle (node-postgres) transaction reference (try-lock, no lockkit)',
          operation: (client) => drizzlePg.transaction((tx) => tx.execute(tryLockSql(client))),
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
          name: 'drizzle (postgres.js) transaction reference (try-lock, no lockkit)',
          operation: (client) => drizzlePjs.transaction((tx) => tx.execute(tryLockSql(client))),
        },
        {
          name: '@lockkit/drizzle (postgres.js) runExclusiveJob, run decision',
          operation: (client) =>
            drizzlePjsLocks.runExclusiveJob(namespace, `dpjs-${runJobs[client]}`, async () => {}),
        },
        {
          name: 'typeorm dataSource.transaction reference (try-lock, no lockkit)',
          operation: (client) => {
            const [k1, k2] = referenceKeys[client] as [number, number];
            return typeorm.transaction((manager) =>
              manager.query('SELECT pg_try_advisory_xact_lock($1::int4, $2::int4)', [k1, k2]),
            );
          },
        },
        {
          name: '@lockkit/typeorm runExclusiveJob, run decision',
          operation: (client) =>
            typeormLocks.runExclusiveJob(namespace, `typeorm-${runJobs[client]}`, async () => {}),
        },
        {
          name: 'kysely (node-postgres) transaction reference (try-lock, no lockkit)',
          operation: (client) => {
            const [k1, k2] = referenceKeys[client] as [number, number];
            return kyselyPg
              .transaction()
              .execute((trx) =>
                kyselySql`SELECT pg_try_advisory_xact_lock(${k1}::int4, ${k2}::int4)`.execute(trx),
              );
          },
        },
        {
          name: '@lockkit/kysely (node-postgres) runExclusiveJob, run decision',
          operation: (client) =>
            kyselyPgLocks.runExclusiveJob(namespace, `kpg-${runJobs[client]}`, async () => {}),
        },
        {
          name: 'knex transaction reference (try-lock, no lockkit)',
          operation: (client) => {
            const [k1, k2] = referenceKeys[client] as [number, number];
            return knexDb.transaction((trx) =>
              trx.raw('SELECT pg_try_advisory_xact_lock(?::int4, ?::int4)', [k1, k2]),
            );
          },
        },
        {
          name: '@lockkit/knex runExclusiveJob, run decision',
          operation: (client) =>
            knexLocks.runExclusiveJob(namespace, `knex-${runJobs[client]}`, async () => {}),
        },
        {
          name: 'pg-boss 10 singleton job cycle (send, fetch, complete)',
          operation: (client) => boss.cycle(client),
        },
        {
          name: 'pg-boss 10 singleton job, one hot queue',
          operation: (client) => boss.cycle(client, true),
        },
      ];
      // Sanity: the skip scenario skips and the run scenario runs.
      const probeRun = await locks.runExclusiveJob(namespace, runJobs[0] as string, async () => 1);
      const probeSkip = await locks.runExclusiveJob(
        namespace,
        skipJobs[0] as string,
        async () => 1,
      );
      const oneTripSkip = await oneTripLocks.runExclusiveJob(
        namespace,
        skipJobs[0] as string,
        async () => 1,
      );
      const pjsSkip = await pjsLocks.runExclusiveJob(
        namespace,
        skipJobs[0] as string,
        async () => 1,
      );
      if (!probeRun.executed || probeSkip.executed || pjsSkip.executed || oneTripSkip.executed) {
        throw new Error('bench scenarios are not what they claim');
      }
      for (const s of scenarios) await measure(s.operation, clients, 200); // warm-up
      const runs = new Map<string, Measurement[]>(scenarios.map((s) => [s.name, []]));
      for (let round = 0; round < rounds; round++) {
        for (const s of scenarios) runs.get(s.name)?.push(await measure(s.operation, clients, ms));
      }
      await holder.end();
      if (typeof redis !== 'string') redis.disconnect();
      await pool.end();
      await sql.end({ timeout: 5 });
      await prisma.$disconnect();
      await prismaPool.end();
      await typeorm.destroy();
      await boss.close();
      await knexDb.destroy();
      pinning?.restore();
      pinning = undefined;
      const results = scenarios.map((s) => ({ name: s.name, m: median(runs.get(s.name) ?? []) }));
      const opsPerSecond = (m: Measurement) => m.operations / m.seconds;
      const floor = opsPerSecond((results[0] as { m: Measurement }).m);
      const reference = opsPerSecond((results[1] as { m: Measurement }).m);
      for (const { name, m } of results) {
        const ops = opsPerSecond(m);
        const row = ROWS[name];
        if (row) {
          const entry = ratios.get(row.path) ?? {};
          entry[`${row.kind}${clients}`] = Number((ops / floor).toFixed(3));
          ratios.set(row.path, entry);
        }
        lines.push(
          `| ${clients} | ${name} | ${Math.round(ops)} | ${percentile(m.latenciesMs, 50).toFixed(3)} | ${percentile(m.latenciesMs, 99).toFixed(3)} | ${(ops / floor).toFixed(2)} | ${(ops / reference).toFixed(2)} |`,
        );
      }
    }
  } finally {
    pinning?.restore();
    await embedded?.stop();
  }
  const server = process.env.DATABASE_URL ? 'DATABASE_URL server' : 'embedded PostgreSQL';
  console.log(
    `\nlockkit bench — ${server}, median of ${rounds} rounds × ${ms} ms per scenario, node ${process.version}\n`,
  );
  console.log('| clients | path | ops/s | p50 ms | p99 ms | × floor | × reference |');
  console.log('|---|---|---|---|---|---|---|');
  for (const line of lines) console.log(line);
  for (const note of notes) console.log(`\nNote: ${note}`);
  console.log('\nRound trips per decision (run / skip), counted on the wire unless marked:');
  for (const [path, rt] of roundTrips) {
    console.log(
      `  ${path}: ${rt.run} / ${rt.skip}${rt.counted === 'protocol' ? ' (by protocol)' : ''}`,
    );
  }
  if (memory) printMemory(memory);
  if (scale) console.log(`\n${describeScale(scale)}`);
  if (flags.json) {
    const cases: Record<string, unknown> = {};
    for (const path of new Set([...roundTrips.keys(), ...ratios.keys()])) {
      const r = ratios.get(path) ?? {};
      const rt = roundTrips.get(path);
      cases[path] = {
        rtRun: rt?.run ?? null,
        rtSkip: rt?.skip ?? null,
        ratio1: r.run1 ?? null,
        ratio16: r.run16 ?? null,
        ratioSkip1: r.skip1 ?? null,
        ratioSkip16: r.skip16 ?? null,
        ratioHot16: r.hot16 ?? null,
      };
    }
    console.log(JSON.stringify({ ms, rounds, clients: clientCounts, cases, memory, scale }));
  }
}

/** One entry of LOCKKIT_BENCH_CLAIM_SPLITS. */
function claimSplit(raw: string): 'shared' | 'owned' {
  const value = raw.trim();
  if (value === 'shared' || value === 'owned') return value;
  throw new Error(
    `LOCKKIT_BENCH_CLAIM_SPLITS takes 'shared' and 'owned', comma-separated; got '${raw}'`,
  );
}

/** One entry of LOCKKIT_BENCH_CLAIM_RUNS. */
function claimRun(raw: string): ClaimRun {
  const value = raw.trim();
  if (value === 'savepoint' || value === 'chained' || value === 'own') return value;
  throw new Error(
    `LOCKKIT_BENCH_CLAIM_RUNS takes 'savepoint', 'chained' and 'own', comma-separated; got '${raw}'`,
  );
}

/** One entry of LOCKKIT_BENCH_CLAIM_AHEAD. */
function claimAhead(raw: string): boolean {
  const value = raw.trim();
  if (value === '0' || value === '1') return value === '1';
  throw new Error(`LOCKKIT_BENCH_CLAIM_AHEAD takes 0 and 1, comma-separated; got '${raw}'`);
}

/** The scheduler's `distribution` option from a flag or an environment list entry. */
function scaleDistribution(raw: string | undefined): ScaleDistribution {
  if (raw === 'every-instance' || raw === 'owned') return raw;
  throw new Error(`--distribution must be 'every-instance' or 'owned'; got '${raw}'`);
}

/** One scale run in a sentence. */
function describeScale(scale: ScaleReport): string {
  const t = scale.perTick;
  return `Scale (${scale.distribution}): ${scale.processes} processes × ${scale.jobsPerProcess} per-second jobs for ${scale.seconds} s: ${scale.decisions} decisions ${JSON.stringify(scale.outcomes)}; per tick ${t.decisions} decisions, ${t.transactions} transactions, ${t.statements} statements, ${t.roundTrips} round trips; decision latency p50 ${scale.p50Ms} ms, p99 ${scale.p99Ms} ms; handler start p50 ${scale.handlerStartP50Ms} ms, p99 ${scale.handlerStartP99Ms} ms; ${scale.runs} runs, ${scale.duplicates} ticks run twice, ${scale.notRun} of the window's ${scale.window.ticks} ticks not run by its end; peak advisory locks in pg_locks ${scale.peakAdvisoryLocks} (granted ${scale.peakGrantedAdvisoryLocks}) for ${scale.processes * scale.jobsPerProcess} registrations`;
}

/** A comma-separated list of whole numbers from 1 in `name`, else `fallback`. */
function countsFrom(name: string, fallback: number[]): number[] {
  const raw = process.env[name];
  if (raw === undefined || raw === '') return fallback;
  const counts = raw.split(',').map(Number);
  if (counts.some((n) => !Number.isInteger(n) || n < 1))
    throw new Error(`${name} must be whole numbers from 1, comma-separated; got '${raw}'`);
  return counts;
}

/**
 * `--scale-matrix`: what this server commits beside 8 Node processes when each transaction is as
 * small as a scheduled run can be (the ceiling); the claim model of issue 25's candidate design at
 * the largest size (claim-model-worker.ts); then the scheduler with 1, 4 and 8 processes ×
 * 100 and 1,000 per-second jobs (LOCKKIT_BENCH_SCALE_PROCESSES, LOCKKIT_BENCH_SCALE_JOBS), each for
 * LOCKKIT_BENCH_SCALE_SECONDS (default 60).
 */
async function scaleMatrix(url: string): Promise<void> {
  const seconds = countsFrom('LOCKKIT_BENCH_SCALE_SECONDS', [60])[0] as number;
  const processCounts = countsFrom('LOCKKIT_BENCH_SCALE_PROCESSES', [1, 4, 8]);
  const jobCounts = countsFrom('LOCKKIT_BENCH_SCALE_JOBS', [100, 1000]);
  const ceiling = await measureCeiling(
    url,
    fileURLToPath(new URL('./ceiling-worker.mjs', import.meta.url)),
    Math.max(...processCounts),
    Math.min(seconds, 30),
  );
  console.log(
    `\nCeiling: ${ceiling.commitsPerSecond} transactions/s (BEGIN, advisory xact lock, one row inserted, COMMIT) from ${ceiling.processes} processes × 10 connections, ${ceiling.seconds} s`,
  );
  // The candidate design's database work alone (see claim-model-worker.ts), at the largest size,
  // for each batch size (rows claimed and run per transaction, LOCKKIT_BENCH_CLAIM_BATCH) and each
  // split (LOCKKIT_BENCH_CLAIM_SPLITS: every process on every job's rows, or each on its own jobs').
  const models: ClaimModelReport[] = [];
  const splits = (process.env.LOCKKIT_BENCH_CLAIM_SPLITS ?? 'shared,owned')
    .split(',')
    .map(claimSplit);
  // Also (LOCKKIT_BENCH_CLAIM_RUNS) how a claimed row runs, the claiming connections per process
  // (LOCKKIT_BENCH_CLAIM_CONNECTIONS) and whether rows are made PENDING ahead of their tick
  // (LOCKKIT_BENCH_CLAIM_AHEAD: 0, 1 or both).
  const runs = (process.env.LOCKKIT_BENCH_CLAIM_RUNS ?? 'savepoint').split(',').map(claimRun);
  const connectionCounts = countsFrom('LOCKKIT_BENCH_CLAIM_CONNECTIONS', [10]);
  const aheads = (process.env.LOCKKIT_BENCH_CLAIM_AHEAD ?? '0').split(',').map(claimAhead);
  for (const split of splits)
    for (const batch of countsFrom('LOCKKIT_BENCH_CLAIM_BATCH', [1, 25]))
      for (const run of runs)
        for (const connections of connectionCounts)
          for (const ahead of aheads) {
            const model = await measureClaimModel(
              url,
              fileURLToPath(new URL('./claim-model-worker.mjs', import.meta.url)),
              Math.max(...processCounts),
              Math.max(...jobCounts),
              Math.min(seconds, 30),
              { batch, split, run, connections, ahead },
            );
            models.push(model);
            console.log(
              `Claim model (${model.split}, run ${model.run}, ${model.connections} connections${model.ahead ? ', rows ahead' : ''}): ${model.processes} processes × ${model.jobs} per-second jobs, ${model.batch} per claim, ${model.seconds} s: ${model.runsPerSecond} runs/s, handler start p50 ${model.handlerStartP50Ms} ms, p99 ${model.handlerStartP99Ms} ms, ${model.duplicates} ticks run twice, ${model.notRun} of the window's ${model.windowTicks} ticks not run`,
            );
          }
  const worker = fileURLToPath(new URL('./scale-worker.mjs', import.meta.url));
  // `none`: the ceiling and the claim models only.
  const distributionList = process.env.LOCKKIT_BENCH_SCALE_DISTRIBUTIONS ?? 'every-instance,owned';
  const distributions =
    distributionList === 'none' ? [] : distributionList.split(',').map(scaleDistribution);
  const rows: ScaleReport[] = [];
  for (const distribution of distributions)
    for (const jobs of jobCounts)
      for (const processes of processCounts) {
        const r = await measureScale(url, worker, processes, jobs, seconds, distribution);
        rows.push(r);
        console.log(describeScale(r));
        if (r.tracePerTick !== undefined) {
          console.log('  statements per tick, by text:');
          for (const [text, n] of Object.entries(r.tracePerTick)) console.log(`  ${n}\t${text}`);
        }
      }
  console.log(
    '\n| distribution | processes × jobs | decisions / tick | transactions / tick | statements / tick | round trips / tick | decision p50 / p99 ms | handler start p50 / p99 ms | runs / s | ticks run twice | ticks not run |',
  );
  console.log('|---|---|---|---|---|---|---|---|---|---|---|');
  for (const r of rows) {
    const t = r.perTick;
    console.log(
      `| ${r.distribution} | ${r.processes} × ${r.jobsPerProcess} | ${t.decisions} | ${t.transactions} | ${t.statements} | ${t.roundTrips} | ${r.p50Ms} / ${r.p99Ms} | ${r.handlerStartP50Ms} / ${r.handlerStartP99Ms} | ${Math.round(r.runs / r.seconds)} | ${r.duplicates} | ${r.notRun} of ${r.window.ticks} |`,
    );
  }
  if (flags.json) console.log(JSON.stringify({ ceiling, models, scale: rows }));
}

/**
 * `--lease-renewal`: p50/p99 of a lease renewal while 0, then 16, contenders hammer the same lease
 * (LOCKKIT_BENCH_MS per round, default 5000; LOCKKIT_BENCH_ROUNDS rounds, default 3, alternating).
 */
async function leaseRenewal(url: string): Promise<void> {
  const perRound = Number(process.env.LOCKKIT_BENCH_MS ?? (flags.quick ? 1000 : 5000));
  const results = await measureRenewalLatency(
    url,
    fileURLToPath(new URL('./lease-contenders.mjs', import.meta.url)),
    [0, 16],
    perRound,
    rounds,
  );
  console.log(
    `\nlockkit bench — lease renewal latency, @lockkit/pg, ${rounds} rounds × ${perRound} ms per contender count, node ${process.version}\n`,
  );
  console.log(
    '| contenders on the same lease | claims/s (all refused) | renewals | renewal p50 ms | renewal p99 ms | renewal max ms | twin p50 ms | twin p99 ms | lock waits sampled | lease lost |',
  );
  console.log('|---|---|---|---|---|---|---|---|---|---|');
  for (const r of results) {
    console.log(
      `| ${r.contenders} | ${r.claimsPerSecond} | ${r.renewals} | ${r.p50Ms.toFixed(2)} | ${r.p99Ms.toFixed(2)} | ${r.maxMs.toFixed(2)} | ${r.twinP50Ms.toFixed(2)} | ${r.twinP99Ms.toFixed(2)} | ${r.lockWaitSamples} | ${r.lost ? 'yes' : 'no'} |`,
    );
  }
  if (flags.json) console.log(JSON.stringify({ leaseRenewal: results }));
}

/** The memory probes' figures, each against the bare process: peak, at once and settled. */
function printMemory(memory: MemoryReport): void {
  const bare = memory.bare;
  const above = (m: ProcessMemory) =>
    `peak RSS ${m.peakRssMb} MB (+${(m.peakRssMb - bare.peakRssMb).toFixed(1)}); after a full GC: RSS ${m.rssMb} MB (+${(m.rssMb - bare.rssMb).toFixed(1)}), live JS ${m.liveMb} MB (+${(m.liveMb - bare.liveMb).toFixed(1)}); settled RSS ${m.settled.rssMb} MB (+${(m.settled.rssMb - bare.settled.rssMb).toFixed(1)}), live JS ${m.settled.liveMb} MB (+${(m.settled.liveMb - bare.settled.liveMb).toFixed(1)})`;
  console.log(
    '\nMemory against a bare process (node-postgres loaded): peak resident set (up to the reading after a full GC, its work and that GC included), after a full GC, and settled (after 10 s idle):',
  );
  console.log(
    `  bare process: peak RSS ${bare.peakRssMb} MB; after a full GC: RSS ${bare.rssMb} MB, live JS ${bare.liveMb} MB; settled RSS ${bare.settled.rssMb} MB, live JS ${bare.settled.liveMb} MB`,
  );
  console.log(`  lock client over 16 open connections: ${above(memory.pool16)}`);
  console.log(
    `  scheduler with 10,000 jobs registered and started, one shared schedule: ${above(memory.scheduler10k)}`,
  );
  console.log(
    `  scheduler with 10,000 jobs registered and started, 10,000 distinct schedules: ${above(memory.scheduler10kDistinct)}`,
  );
}

main().catch((error: unknown) => {
  console.error(error);
  process.exitCode = 1;
});
