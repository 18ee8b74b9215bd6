/**
 * lockkit with Knex (the pg client). Two instances of one service (two Knex instances, two
 * schedulers — in one process here so the example can check itself) run a per-second cron job and
 * race for one long job. Every tick runs exactly once; the long job runs once, under a lease, with
 * fenced writes. The jobs write through Knex's query builder on the `trx` lockkit hands them.
 *
 *   DATABASE_URL=postgres://postgres@127.0.0.1:5432/test npm run build && npm run example
 */
import { createScheduler } from '@lockkit/core';
import { createLockKit } from '@lockkit/knex';
import knex from 'knex';

const url = process.env.DATABASE_URL;
if (!url) {
  console.error('Set DATABASE_URL to a PostgreSQL database you may create a schema in.');
  process.exit(2);
}

const schema = 'lockkit_example_knex'; // lockkit's tables and this example's own
const setup = knex({ client: 'pg', connection: url, pool: { min: 0, max: 1 } });
await setup.raw(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
await setup.raw(`CREATE SCHEMA ${schema}`);
await setup.schema.withSchema(schema).createTable('invoice_runs', (t) => {
  t.timestamp('tick', { useTz: true }).notNullable();
  t.text('instance').notNullable();
});
await setup.schema.withSchema(schema).createTable('report_rows', (t) => {
  t.text('region').notNullable();
  t.text('instance').notNullable();
  t.bigInteger('token').notNullable();
});

/** One instance of the service: its own Knex (and pool), lock client and scheduler. */
async function startInstance(name: string) {
  const db = knex({
    client: 'pg',
    connection: { connectionString: url, application_name: `example-${name}` },
    pool: { min: 0, max: 4 },
  });
  const locks = createLockKit(db, { schema });
  await locks.migrate(); // idempotent and safe from every instance at start-up

  const scheduler = createScheduler(locks, { owner: name });
  // A short job in transaction mode: its insert commits with the tick's ledger row, once per tick.
  scheduler.register('knex-example-invoices', '* * * * * *', async (run) => {
    if (run.mode !== 'transaction') return;
    await run.tx
      .withSchema(schema)
      .table('invoice_runs')
      .insert({ tick: run.tick, instance: name });
  });
  scheduler.on('failed', (e) => console.error(`${name}: ${e.job} failed`, e.error));
  await scheduler.start();

  /** A long job: a lease is claimed, then the work runs outside any transaction, fenced. */
  async function nightlyReport(): Promise<boolean> {
    const r = await locks.runWithLease(
      'reports',
      'knex-example-nightly',
      async (lease) => {
        for (const region of ['eu', 'us', 'ap']) {
          lease.signal.throwIfAborted(); // stop at once if the lease was lost
          await new Promise((resolve) => setTimeout(resolve, 300)); // minutes of work, in real life
          await lease.fenced((trx) =>
            trx
              .withSchema(schema)
              .table('report_rows')
              .insert({ region, instance: name, token: lease.token.toString() }),
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

const ticks: { runs: number }[] = await setup
  .withSchema(schema)
  .table('invoice_runs')
  .select('tick')
  .count({ runs: '*' })
  .groupBy('tick');
const [report] = await setup.withSchema(schema).table('report_rows').count({ rows: '*' });
await setup.destroy();

const duplicated = ticks.filter((t) => Number(t.runs) !== 1).length;
const ran = reports.filter(Boolean).length;
const rows = Number(report?.rows);
console.log(
  `invoice ticks run: ${ticks.length}, run twice: ${duplicated}; report runs: ${ran}, rows: ${rows}`,
);
if (ticks.length < 2 || duplicated > 0 || ran !== 1 || rows !== 3) {
  console.error('unexpected result');
  process.exit(1);
}
