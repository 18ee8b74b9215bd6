/**
 * lockkit with Kysely (PostgresDialect on node-postgres). Two instances of one service (two pools,
 * two `db`s, two schedulers — in one process here so the example can check itself) run a
 * per-second cron job and race for one long job. Every tick runs exactly once; the long job runs
 * once, under a lease, with fenced writes. The jobs write through Kysely's query builder on the
 * `Transaction` lockkit hands them.
 *
 *   DATABASE_URL=postgres://postgres@127.0.0.1:5432/test npm run build && npm run example
 */
import { createScheduler } from '@lockkit/core';
import { createLockKit } from '@lockkit/kysely';
import { Kysely, PostgresDialect, sql } from 'kysely';
import pg from 'pg';

const url = process.env.DATABASE_URL;
if (!url) {
  console.error('Set DATABASE_URL to a PostgreSQL database you may create a schema in.');
  process.exit(2);
}

const SCHEMA = 'lockkit_example_kysely'; // lockkit's tables and this example's own

/** This example's tables, as Kysely sees them. */
interface Database {
  'lockkit_example_kysely.invoice_runs': { tick: Date; instance: string };
  'lockkit_example_kysely.report_rows': { region: string; instance: string; token: bigint };
}

/** A Kysely database on its own pool; the pool is also given to lockkit. */
function open(applicationName: string, max: number) {
  const pool = new pg.Pool({ connectionString: url, max, application_name: applicationName });
  return { pool, db: new Kysely<Database>({ dialect: new PostgresDialect({ pool }) }) };
}

const setup = open('example-setup', 1).db;
await sql`DROP SCHEMA IF EXISTS ${sql.id(SCHEMA)} CASCADE`.execute(setup);
await sql`CREATE SCHEMA ${sql.id(SCHEMA)}`.execute(setup);
await sql`CREATE TABLE ${sql.id(SCHEMA, 'invoice_runs')} (tick timestamptz NOT NULL, instance text NOT NULL)`.execute(
  setup,
);
await sql`CREATE TABLE ${sql.id(SCHEMA, 'report_rows')} (region text NOT NULL, instance text NOT NULL, token bigint NOT NULL)`.execute(
  setup,
);

/** One instance of the service: its own pool and `db`, lock client and scheduler. */
async function startInstance(name: string) {
  const { pool, db } = open(`example-${name}`, 4);
  const locks = createLockKit(db, { pool, schema: SCHEMA });
  await locks.migrate(); // idempotent and safe from every instance at start-up

  const scheduler = createScheduler(locks, { owner: name });
  // A short job in transaction mode: its insert commits with the tick's ledger row, once per tick.
  scheduler.register('kysely-example-invoices', '* * * * * *', async (run) => {
    if (run.mode !== 'transaction') return;
    await run.tx
      .insertInto('lockkit_example_kysely.invoice_runs')
      .values({ tick: run.tick, instance: name })
      .execute();
  });
  scheduler.on('failed', (e) => console.error(`${name}: ${e.job} failed`, e.error));
  await scheduler.start();

  /** A long job: a lease is claimed, then the work runs outside any transaction, fenced. */
  async function nightlyReport(): Promise<boolean> {
    const r = await locks.runWithLease(
      'reports',
      'kysely-example-nightly',
      async (lease) => {
        for (const region of ['eu', 'us', 'ap']) {
          lease.signal.throwIfAborted(); // stop at once if the lease was lost
          await new Promise((resolve) => setTimeout(resolve, 300)); // minutes of work, in real life
          await lease.fenced((trx) =>
            trx
              .insertInto('lockkit_example_kysely.report_rows')
              .values({ region, instance: name, token: lease.token })
              .execute(),
          );
        }
      },
      { ttlMs: 10_000 },
    );
    if (r.executed) console.log(`${name}: ran the nightly report with fencing token ${r.token}`);
    else
      console.log(
        `${name}: report skipped, ${r.holder ? `held by ${r.holder.owner}` : 'being claimed'}`,
      );
    return r.executed;
  }

  return { db, scheduler, nightlyReport };
}

const instances = [await startInstance('a'), await startInstance('b')];
const reports = await Promise.all(instances.map((i) => i.nightlyReport()));
await new Promise((resolve) => setTimeout(resolve, 3000));
for (const { scheduler, db } of instances) {
  await scheduler.stop({ timeoutMs: 5000 });
  await db.destroy();
}

const ticks = await setup
  .selectFrom('lockkit_example_kysely.invoice_runs')
  .select(['tick', (eb) => eb.fn.countAll<string>().as('runs')])
  .groupBy('tick')
  .execute();
const report = await setup
  .selectFrom('lockkit_example_kysely.report_rows')
  .select((eb) => eb.fn.countAll<string>().as('rows'))
  .executeTakeFirstOrThrow();
await setup.destroy();

const duplicated = ticks.filter((t) => Number(t.runs) !== 1).length;
const ran = reports.filter(Boolean).length;
console.log(
  `invoice ticks run: ${ticks.length}, run twice: ${duplicated}; report runs: ${ran}, rows: ${report.rows}`,
);
if (ticks.length < 2 || duplicated > 0 || ran !== 1 || Number(report.rows) !== 3) {
  console.error('unexpected result');
  process.exit(1);
}
