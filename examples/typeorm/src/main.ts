/**
 * lockkit with TypeORM (the `postgres` driver). Two instances of one service (two DataSources, two
 * schedulers — in one process here so the example can check itself) run a per-second cron job and
 * race for one long job. Every tick runs exactly once; the long job runs once, under a lease, with
 * fenced writes. The jobs write through TypeORM's EntityManager inside lockkit's transactions.
 *
 *   DATABASE_URL=postgres://postgres@127.0.0.1:5432/test npm run build && npm run example
 */
import { createScheduler } from '@lockkit/core';
import { createLockKit } from '@lockkit/typeorm';
import { DataSource, EntitySchema } from 'typeorm';

const url = process.env.DATABASE_URL;
if (!url) {
  console.error('Set DATABASE_URL to a PostgreSQL database you may create a schema in.');
  process.exit(2);
}

const schema = 'lockkit_example_typeorm'; // lockkit's tables and this example's own

interface InvoiceRun {
  tick: Date;
  instance: string;
}
const InvoiceRun = new EntitySchema<InvoiceRun>({
  name: 'InvoiceRun',
  tableName: 'invoice_runs',
  schema,
  columns: {
    tick: { type: 'timestamptz', primary: true },
    instance: { type: 'text', primary: true },
  },
});

interface ReportRow {
  region: string;
  instance: string;
  /** A bigint column: TypeORM reads and writes it as a string. */
  token: string;
}
const ReportRow = new EntitySchema<ReportRow>({
  name: 'ReportRow',
  tableName: 'report_rows',
  schema,
  columns: {
    region: { type: 'text', primary: true },
    instance: { type: 'text' },
    token: { type: 'bigint' },
  },
});

const setup = await new DataSource({ type: 'postgres', url, poolSize: 1 }).initialize();
await setup.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
await setup.query(`CREATE SCHEMA ${schema}`);
await setup.query(
  `CREATE TABLE ${schema}.invoice_runs (tick timestamptz NOT NULL, instance text NOT NULL, PRIMARY KEY (tick, instance))`,
);
await setup.query(
  `CREATE TABLE ${schema}.report_rows (region text PRIMARY KEY, instance text NOT NULL, token bigint NOT NULL)`,
);

/** One instance of the service: its own DataSource (and pool), lock client and scheduler. */
async function startInstance(name: string) {
  const dataSource = await new DataSource({
    type: 'postgres',
    url,
    poolSize: 4,
    applicationName: `example-${name}`,
    entities: [InvoiceRun, ReportRow],
  }).initialize();
  const locks = createLockKit(dataSource, { schema });
  await locks.migrate(); // idempotent and safe from every instance at start-up

  const scheduler = createScheduler(locks, { owner: name });
  // A short job in transaction mode: its insert commits with the tick's ledger row, once per tick.
  scheduler.register('typeorm-example-invoices', '* * * * * *', async (run) => {
    if (run.mode !== 'transaction') return;
    // `run.tx` is the EntityManager of the tick's transaction.
    await run.tx.insert(InvoiceRun, { tick: run.tick, instance: name });
  });
  scheduler.on('failed', (e) => console.error(`${name}: ${e.job} failed`, e.error));
  await scheduler.start();

  /** A long job: a lease is claimed, then the work runs outside any transaction, fenced. */
  async function nightlyReport(): Promise<boolean> {
    const r = await locks.runWithLease(
      'reports',
      'typeorm-example-nightly',
      async (lease) => {
        for (const region of ['eu', 'us', 'ap']) {
          lease.signal.throwIfAborted(); // stop at once if the lease was lost
          await new Promise((resolve) => setTimeout(resolve, 300)); // minutes of work, in real life
          await lease.fenced((manager) =>
            manager.insert(ReportRow, { region, instance: name, token: String(lease.token) }),
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

  return { dataSource, scheduler, nightlyReport };
}

const instances = [await startInstance('a'), await startInstance('b')];
const reports = await Promise.all(instances.map((i) => i.nightlyReport()));
await new Promise((resolve) => setTimeout(resolve, 3000));
for (const { scheduler, dataSource } of instances) {
  await scheduler.stop({ timeoutMs: 5000 });
  await dataSource.destroy();
}

const ticks: { runs: number }[] = await setup.query(
  `SELECT count(*)::int AS runs FROM ${schema}.invoice_runs GROUP BY tick`,
);
const [report]: { rows: number }[] = await setup.query(
  `SELECT count(*)::int AS rows FROM ${schema}.report_rows`,
);
await setup.destroy();

const duplicated = ticks.filter((t) => t.runs !== 1).length;
const ran = reports.filter(Boolean).length;
console.log(
  `invoice ticks run: ${ticks.length}, run twice: ${duplicated}; report runs: ${ran}, rows: ${report?.rows}`,
);
if (ticks.length < 2 || duplicated > 0 || ran !== 1 || report?.rows !== 3) {
  console.error('unexpected result');
  process.exit(1);
}
