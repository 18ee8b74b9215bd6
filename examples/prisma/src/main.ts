/**
 * lockkit with Prisma 7 (the Rust-free client over `@prisma/adapter-pg`). Two instances of one
 * service (two Prisma clients, two schedulers — in one process here so the example can check
 * itself) run a per-second cron job and race for one long job. Every tick runs exactly once; the
 * long job runs once, under a lease, with fenced writes through Prisma's transaction client.
 *
 *   DATABASE_URL=postgres://postgres@127.0.0.1:5432/test npm run build && npm run example
 */
import { createScheduler } from '@lockkit/core';
import { createLockKit } from '@lockkit/prisma';
import { PrismaPg } from '@prisma/adapter-pg';
import { PrismaClient } from './generated/prisma/client.js';

const url = process.env.DATABASE_URL;
if (!url) {
  console.error('Set DATABASE_URL to a PostgreSQL database you may create tables in.');
  process.exit(2);
}
const schema = 'lockkit_example_prisma'; // where lockkit keeps its lease and ledger tables

const connect = (name: string) =>
  new PrismaClient({
    adapter: new PrismaPg({ connectionString: url, max: 4, application_name: `example-${name}` }),
  });

const setup = connect('setup');
await setup.$executeRawUnsafe(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
await setup.$executeRawUnsafe(
  'DROP TABLE IF EXISTS lockkit_example_prisma_invoice_runs, lockkit_example_prisma_report_rows',
);
await setup.$executeRawUnsafe(
  'CREATE TABLE lockkit_example_prisma_invoice_runs (id serial PRIMARY KEY, tick timestamptz NOT NULL, instance text NOT NULL)',
);
await setup.$executeRawUnsafe(
  'CREATE TABLE lockkit_example_prisma_report_rows (id serial PRIMARY KEY, region text NOT NULL, instance text NOT NULL, token bigint NOT NULL)',
);

/** One instance of the service: its own Prisma client, lock client and scheduler. */
async function startInstance(name: string) {
  const prisma = connect(name);
  // Prisma ends an interactive transaction after `timeout` ms (5 s by default): raise it for jobs
  // that take longer, or run them in lease mode, which holds no transaction.
  const locks = createLockKit(prisma, { schema, timeout: 15_000 });
  await locks.migrate(); // idempotent and safe from every instance at start-up

  const scheduler = createScheduler(locks, { owner: name });
  // A short job in transaction mode: its write commits with the tick's ledger row, once per tick.
  scheduler.register('prisma-example-invoices', '* * * * * *', async (run) => {
    if (run.mode !== 'transaction') return;
    await run.tx.invoiceRun.create({ data: { tick: run.tick, instance: name } });
  });
  scheduler.on('failed', (e) => console.error(`${name}: ${e.job} failed`, e.error));
  await scheduler.start();

  /** A long job: a lease is claimed, then the work runs outside any transaction, fenced. */
  async function nightlyReport(): Promise<boolean> {
    const r = await locks.runWithLease(
      'reports',
      'prisma-example-nightly',
      async (lease) => {
        for (const region of ['eu', 'us', 'ap']) {
          lease.signal.throwIfAborted(); // stop at once if the lease was lost
          await new Promise((resolve) => setTimeout(resolve, 300)); // minutes of work, in real life
          await lease.fenced((tx) =>
            tx.reportRow.create({ data: { region, instance: name, token: lease.token } }),
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

  return { prisma, scheduler, nightlyReport };
}

const instances = [await startInstance('a'), await startInstance('b')];
const reports = await Promise.all(instances.map((i) => i.nightlyReport()));
await new Promise((resolve) => setTimeout(resolve, 3000));
for (const { scheduler, prisma } of instances) {
  await scheduler.stop({ timeoutMs: 5000 });
  await prisma.$disconnect();
}

const ticks = await setup.invoiceRun.groupBy({ by: ['tick'], _count: { _all: true } });
const reportRows = await setup.reportRow.count();
await setup.$disconnect();

const duplicated = ticks.filter((t) => t._count._all !== 1).length;
const ran = reports.filter(Boolean).length;
console.log(
  `invoice ticks run: ${ticks.length}, run twice: ${duplicated}; report runs: ${ran}, rows: ${reportRows}`,
);
if (ticks.length < 2 || duplicated > 0 || ran !== 1 || reportRows !== 3) {
  console.error('unexpected result');
  process.exit(1);
}
