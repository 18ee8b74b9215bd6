/**
 * lockkit with Drizzle ORM (on node-postgres). Two instances of one service (two `db`s, two
 * schedulers — in one process here so the example can check itself) run a per-second cron job and
 * race for one long job. Every tick runs exactly once; the long job runs once, under a lease, with
 * fenced writes. The jobs write through Drizzle's query builder inside lockkit's transactions.
 *
 *   DATABASE_URL=postgres://postgres@127.0.0.1:5432/test npm run build && npm run example
 */
import { createScheduler } from '@lockkit/core';
import { createLockKit } from '@lockkit/drizzle';
import { count, sql } from 'drizzle-orm';
import { drizzle } from 'drizzle-orm/node-postgres';
import { bigint, pgSchema, text, timestamp } from 'drizzle-orm/pg-core';

const url = process.env.DATABASE_URL;
if (!url) {
  console.error('Set DATABASE_URL to a PostgreSQL database you may create a schema in.');
  process.exit(2);
}

const example = pgSchema('lockkit_example_drizzle'); // lockkit's tables and this example's own
const invoiceRuns = example.table('invoice_runs', {
  tick: timestamp('tick', { withTimezone: true }).notNull(),
  instance: text('instance').notNull(),
});
const reportRows = example.table('report_rows', {
  region: text('region').notNull(),
  instance: text('instance').notNull(),
  token: bigint('token', { mode: 'bigint' }).notNull(),
});

const setup = drizzle({ connection: { connectionString: url, max: 1 } });
await setup.execute(sql`DROP SCHEMA IF EXISTS lockkit_example_drizzle CASCADE`);
await setup.execute(sql`CREATE SCHEMA lockkit_example_drizzle`);
await setup.execute(
  sql`CREATE TABLE lockkit_example_drizzle.invoice_runs (tick timestamptz NOT NULL, instance text NOT NULL)`,
);
await setup.execute(
  sql`CREATE TABLE lockkit_example_drizzle.report_rows (region text NOT NULL, instance text NOT NULL, token bigint NOT NULL)`,
);

/** One instance of the service: its own `db` (and pool), lock client and scheduler. */
async function startInstance(name: string) {
  const db = drizzle({
    connection: { connectionString: url, max: 4, application_name: `example-${name}` },
  });
  const locks = createLockKit(db, { schema: 'lockkit_example_drizzle' });
  await locks.migrate(); // idempotent and safe from every instance at start-up

  const scheduler = createScheduler(locks, { owner: name });
  // A short job in transaction mode: its insert commits with the tick's ledger row, once per tick.
  scheduler.register('drizzle-example-invoices', '* * * * * *', async (run) => {
    if (run.mode !== 'transaction') return;
    await run.tx.insert(invoiceRuns).values({ tick: run.tick, instance: name });
  });
  scheduler.on('failed', (e) => console.error(`${name}: ${e.job} failed`, e.error));
  await scheduler.start();

  /** A long job: a lease is claimed, then the work runs outside any transaction, fenced. */
  async function nightlyReport(): Promise<boolean> {
    const r = await locks.runWithLease(
      'reports',
      'drizzle-example-nightly',
      async (lease) => {
        for (const region of ['eu', 'us', 'ap']) {
          lease.signal.throwIfAborted(); // stop at once if the lease was lost
          await new Promise((resolve) => setTimeout(resolve, 300)); // minutes of work, in real life
          await lease.fenced((tx) =>
            tx.insert(reportRows).values({ region, instance: name, token: lease.token }),
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
  await db.$client.end();
}

const ticks = await setup
  .select({ tick: invoiceRuns.tick, runs: count() })
  .from(invoiceRuns)
  .groupBy(invoiceRuns.tick);
const [report] = await setup.select({ rows: count() }).from(reportRows);
await setup.$client.end();

const duplicated = ticks.filter((t) => t.runs !== 1).length;
const ran = reports.filter(Boolean).length;
console.log(
  `invoice ticks run: ${ticks.length}, run twice: ${duplicated}; report runs: ${ran}, rows: ${report?.rows}`,
);
if (ticks.length < 2 || duplicated > 0 || ran !== 1 || report?.rows !== 3) {
  console.error('unexpected result');
  process.exit(1);
}
