/**
 * lockkit in a NestJS application. Two replicas of one service (two Nest application contexts,
 * two pools — in one process here so that the example can check itself) each run every scheduled
 * method; lockkit makes each tick run once across them:
 *
 * - `@ExclusiveCron` per second, transaction mode: the write commits with the tick's ledger row;
 * - `@ExclusiveCron` in lease mode, for a long job: no transaction held, each write fenced;
 * - `@nestjs/schedule`'s own `@Cron()` guarded by `@Exclusive`: never run by both at once.
 *
 *   DATABASE_URL=postgres://postgres@127.0.0.1:5432/test npm run build && npm run example
 */
import 'reflect-metadata';
import type { LeaseRun, TransactionRun } from '@lockkit/core';
import { Exclusive, ExclusiveCron, LockkitScheduleModule } from '@lockkit/nestjs';
import { createLockKit } from '@lockkit/pg';
import { Inject, Injectable, Module, type OnApplicationShutdown } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { Cron, ScheduleModule } from '@nestjs/schedule';
import pg from 'pg';

const url = process.env.DATABASE_URL;
if (!url) {
  console.error('Set DATABASE_URL to a PostgreSQL database you may create a schema in.');
  process.exit(2);
}
const schema = 'lockkit_example_nestjs'; // lockkit's tables and this example's own, in one schema

const setup = new pg.Pool({ connectionString: url, max: 1 });
await setup.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
await setup.query(`CREATE SCHEMA ${schema}`);
await setup.query(`CREATE TABLE ${schema}.invoice_runs (tick timestamptz, replica text)`);
await setup.query(
  `CREATE TABLE ${schema}.export_rows (tick timestamptz, part int, replica text, token bigint)`,
);

/** Which replica this is (a host name, in real life). */
const REPLICA = 'REPLICA';
/** This replica's pool. */
const POOL = 'POOL';

/** How many guarded cleanups run right now, across both replicas, and the most ever at once. */
const cleanups = { active: 0, most: 0, runs: 0 };

@Injectable()
class Billing {
  constructor(@Inject(REPLICA) private readonly replica: string) {}

  // Every second, once across the replicas; the write commits with the tick's ledger row.
  @ExclusiveCron('* * * * * *', { name: 'nest-example-invoices' })
  async issue(run: TransactionRun<pg.PoolClient>) {
    await run.tx.query(`INSERT INTO ${schema}.invoice_runs VALUES ($1, $2)`, [
      run.tick,
      this.replica,
    ]);
  }

  // A long job (every 2 s here; nightly in real life), under a lease: no transaction is held
  // while it runs, and each write checks the lease's fencing token.
  @ExclusiveCron('*/2 * * * * *', { name: 'nest-example-export', mode: 'lease' })
  async export(run: LeaseRun<pg.PoolClient>) {
    for (const part of [1, 2, 3]) {
      run.signal.throwIfAborted(); // stop at once if the lease is lost or the app shuts down
      await new Promise((resolve) => setTimeout(resolve, 100)); // minutes of work, in real life
      await run.lease.fenced((client) =>
        client.query(`INSERT INTO ${schema}.export_rows VALUES ($1, $2, $3, $4)`, [
          run.tick,
          part,
          this.replica,
          run.lease.token,
        ]),
      );
    }
  }

  // An existing @nestjs/schedule method: @Exclusive keeps the replicas from running it together.
  @Cron('* * * * * *')
  @Exclusive({ name: 'nest-example-cleanup' })
  async cleanup() {
    cleanups.runs += 1;
    cleanups.active += 1;
    cleanups.most = Math.max(cleanups.most, cleanups.active);
    await new Promise((resolve) => setTimeout(resolve, 200));
    cleanups.active -= 1;
  }
}

/** Ends the pool after lockkit's scheduler has drained (Nest runs this hook last). */
@Injectable()
class PoolCloser implements OnApplicationShutdown {
  constructor(@Inject(POOL) private readonly pool: pg.Pool) {}
  onApplicationShutdown() {
    return this.pool.end();
  }
}

/** One replica of the service: its own pool, lock client and Nest application. */
async function startReplica(replica: string) {
  const pool = new pg.Pool({ connectionString: url, max: 4, application_name: `nest-${replica}` });
  @Module({
    imports: [
      ScheduleModule.forRoot(),
      LockkitScheduleModule.forRoot({
        lockKit: createLockKit(pool, { schema }),
        migrate: true, // lockkit's tables, the ledger among them; safe from every replica
        scheduler: { owner: replica },
      }),
    ],
    providers: [
      Billing,
      PoolCloser,
      { provide: REPLICA, useValue: replica },
      { provide: POOL, useValue: pool },
    ],
  })
  class AppModule {}
  const app = await NestFactory.createApplicationContext(AppModule, { logger: ['error', 'warn'] });
  app.enableShutdownHooks(); // SIGTERM closes the app: the scheduler stops and drains
  return app;
}

const replicas = await Promise.all([startReplica('a'), startReplica('b')]);
await new Promise((resolve) => setTimeout(resolve, 4500));
// Closing aborts a run still going (its signal fires; a lease-mode run's fenced parts so far stay
// written, and its tick goes back to the ledger for the next replica to start): judge the export
// ticks that had a full second to finish before the close began.
const closing = Date.now();
await Promise.all(replicas.map((app) => app.close()));

const { rows: ticks } = await setup.query<{ tick: Date; runs: number }>(
  `SELECT tick, count(*)::int AS runs FROM ${schema}.invoice_runs GROUP BY tick ORDER BY tick`,
);
// Per export tick: which replicas wrote, under how many tokens, how many rows.
const { rows: exports } = await setup.query<{
  tick: Date;
  replicas: string;
  tokens: number;
  rows: number;
}>(
  `SELECT tick, string_agg(DISTINCT replica, ',') AS replicas,
          count(DISTINCT token)::int AS tokens, count(*)::int AS rows
     FROM ${schema}.export_rows GROUP BY tick ORDER BY tick`,
);
await setup.end();

const duplicated = ticks.filter((t) => t.runs !== 1).length;
const finished = exports.filter((e) => e.tick.getTime() + 1000 <= closing);
for (const e of exports)
  console.log(
    `export @ ${e.tick.toISOString()}: ran by ${e.replicas}, ${e.rows} fenced rows${finished.includes(e) ? '' : ' (within a second of the close, which cuts a run short: not judged)'}`,
  );
const badExports = finished.filter(
  (e) => e.tokens !== 1 || e.rows !== 3 || e.replicas.includes(','),
);
console.log(
  `invoice ticks run: ${ticks.length}, run twice: ${duplicated}; export ticks run: ${finished.length}, not exactly once: ${badExports.length}; cleanups: ${cleanups.runs}, at once at most: ${cleanups.most}`,
);
if (
  ticks.length < 3 ||
  duplicated > 0 ||
  finished.length < 1 ||
  badExports.length > 0 ||
  cleanups.runs < 2 ||
  cleanups.most !== 1
) {
  console.error('unexpected result');
  process.exit(1);
}
