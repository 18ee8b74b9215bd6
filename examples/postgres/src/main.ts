/**
 * lockkit with postgres.js, in a CommonJS project (this file compiles to `require` calls). Two
 * instances of one service (two `sql` pools, two schedulers — in one process here so the example
 * can check itself) run a per-second cron job and race for one long job. Every tick runs exactly
 * once; the long job runs once, under a lease, with fenced writes.
 *
 *   DATABASE_URL=postgres://postgres@127.0.0.1:5432/test npm run build && npm run example
 */
import { createScheduler } from '@lockkit/core';
import { createLockKit } from '@lockkit/postgres';
import postgres from 'postgres';

const schema = 'lockkit_example_postgres'; // lockkit's tables and this example's own

/** One instance of the service: its own connection pool, lock client and scheduler. */
async function startInstance(url: string, name: string) {
  const sql = postgres(url, {
    max: 4,
    connection: { application_name: `example-${name}` },
    onnotice: () => {},
  });
  const locks = createLockKit(sql, { schema });
  await locks.migrate(); // idempotent and safe from every instance at start-up

  const scheduler = createScheduler(locks, { owner: name });
  // A short job in transaction mode: its write commits with the tick's ledger row, once per tick.
  scheduler.register('postgres-example-invoices', '* * * * * *', async (run) => {
    if (run.mode !== 'transaction') return;
    await run.tx`INSERT INTO lockkit_example_postgres.invoice_runs (tick, instance) VALUES (${run.tick}, ${name})`;
  });
  scheduler.on('failed', (e) => console.error(`${name}: ${e.job} failed`, e.error));
  await scheduler.start();

  /** A long job: a lease is claimed, then the work runs outside any transaction, fenced. */
  async function nightlyReport(): Promise<boolean> {
    const r = await locks.runWithLease(
      'reports',
      'postgres-example-nightly',
      async (lease) => {
        for (const region of ['eu', 'us', 'ap']) {
          lease.signal.throwIfAborted(); // stop at once if the lease was lost
          await new Promise((resolve) => setTimeout(resolve, 300)); // minutes of work, in real life
          await lease.fenced(
            (tx) =>
              tx`INSERT INTO lockkit_example_postgres.report_rows VALUES (${region}, ${name}, ${String(lease.token)})`,
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

  return { sql, scheduler, nightlyReport };
}

async function main(): Promise<number> {
  const url = process.env.DATABASE_URL;
  if (!url) {
    console.error('Set DATABASE_URL to a PostgreSQL database you may create a schema in.');
    return 2;
  }
  const setup = postgres(url, { max: 1, onnotice: () => {} });
  await setup`DROP SCHEMA IF EXISTS lockkit_example_postgres CASCADE`;
  await setup`CREATE SCHEMA lockkit_example_postgres`;
  await setup`CREATE TABLE lockkit_example_postgres.invoice_runs (tick timestamptz, instance text)`;
  await setup`CREATE TABLE lockkit_example_postgres.report_rows (region text, instance text, token bigint)`;

  const instances = [await startInstance(url, 'a'), await startInstance(url, 'b')];
  const reports = await Promise.all(instances.map((i) => i.nightlyReport()));
  await new Promise((resolve) => setTimeout(resolve, 3000));
  for (const { scheduler, sql } of instances) {
    await scheduler.stop({ timeoutMs: 5000 });
    await sql.end();
  }

  const ticks = await setup<{ tick: Date; runs: number }[]>`
    SELECT tick, count(*)::int AS runs FROM lockkit_example_postgres.invoice_runs GROUP BY tick ORDER BY tick`;
  const report = await setup`SELECT region FROM lockkit_example_postgres.report_rows`;
  await setup.end();

  const duplicated = ticks.filter((t) => t.runs !== 1).length;
  const ran = reports.filter(Boolean).length;
  console.log(
    `invoice ticks run: ${ticks.length}, run twice: ${duplicated}; report runs: ${ran}, rows: ${report.length}`,
  );
  return ticks.length >= 2 && duplicated === 0 && ran === 1 && report.length === 3 ? 0 : 1;
}

main().then(
  (code) => {
    if (code === 1) console.error('unexpected result');
    process.exitCode = code;
  },
  (error: unknown) => {
    console.error(error);
    process.exitCode = 1;
  },
);
