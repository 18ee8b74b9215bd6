/**
 * lockkit with node-postgres. Two instances of one service (two pools, two schedulers — in one
 * process here so the example can check itself) run a per-second cron job and race for one long
 * job. Every tick runs exactly once; the long job runs once, under a lease, with fenced writes.
 *
 *   DATABASE_URL=postgres://postgres@127.0.0.1:5432/test npm run build && npm run example
 */
import { createScheduler, type Scheduler } from '@lockkit/core';
import { createLockKit } from '@lockkit/pg';
import pg from 'pg';

const url = process.env.DATABASE_URL;
if (!url) {
  console.error('Set DATABASE_URL to a PostgreSQL database you may create a schema in.');
  process.exit(2);
}
const schema = 'lockkit_example_pg'; // lockkit's tables and this example's own, in one schema

const setup = new pg.Pool({ connectionString: url, max: 1 });
await setup.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
await setup.query(`CREATE SCHEMA ${schema}`);
await setup.query(`CREATE TABLE ${schema}.invoice_runs (tick timestamptz, instance text)`);
await setup.query(`CREATE TABLE ${schema}.report_rows (region text, instance text, token bigint)`);

/** One instance of the service: its own pool, lock client and scheduler. */
async function startInstance(
  name: string,
): Promise<{ pool: pg.Pool; scheduler: Scheduler<pg.PoolClient> }> {
  const pool = new pg.Pool({ connectionString: url, max: 4, application_name: `example-${name}` });
  const locks = createLockKit(pool, { schema });
  await locks.migrate(); // idempotent and safe from every instance at start-up

  const scheduler = createScheduler(locks, { owner: name });
  // A short job in transaction mode: its write commits with the tick's ledger row, once per tick.
  scheduler.register('pg-example-invoices', '* * * * * *', async (run) => {
    if (run.mode !== 'transaction') return;
    await run.tx.query(`INSERT INTO ${schema}.invoice_runs (tick, instance) VALUES ($1, $2)`, [
      run.tick,
      name,
    ]);
  });
  scheduler.on('failed', (e) => console.error(`${name}: ${e.job} failed`, e.error));
  await scheduler.start();

  return { pool, scheduler };
}

/** A long job: a lease is claimed, then the work runs outside any transaction, fenced. */
async function nightlyReport(pool: pg.Pool, name: string): Promise<boolean> {
  const locks = createLockKit(pool, { schema });
  const r = await locks.runWithLease(
    'reports',
    'pg-example-nightly',
    async (lease) => {
      for (const region of ['eu', 'us', 'ap']) {
        lease.signal.throwIfAborted(); // stop at once if the lease was lost
        await new Promise((resolve) => setTimeout(resolve, 300)); // minutes of work, in real life
        await lease.fenced((client) =>
          client.query(`INSERT INTO ${schema}.report_rows VALUES ($1, $2, $3)`, [
            region,
            name,
            lease.token,
          ]),
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

const instances = [await startInstance('a'), await startInstance('b')];
const reports = await Promise.all(
  instances.map(({ pool }, i) => nightlyReport(pool, i ? 'b' : 'a')),
);
await new Promise((resolve) => setTimeout(resolve, 3000));
for (const { scheduler, pool } of instances) {
  await scheduler.stop({ timeoutMs: 5000 });
  await pool.end();
}

const { rows: ticks } = await setup.query<{ tick: Date; runs: number }>(
  `SELECT tick, count(*)::int AS runs FROM ${schema}.invoice_runs GROUP BY tick ORDER BY tick`,
);
const { rows: report } = await setup.query(`SELECT region FROM ${schema}.report_rows`);
await setup.end();

const duplicated = ticks.filter((t) => t.runs !== 1).length;
console.log(
  `invoice ticks run: ${ticks.length}, run twice: ${duplicated}; report runs: ${reports.filter(Boolean).length}, rows: ${report.length}`,
);
if (
  ticks.length < 2 ||
  duplicated > 0 ||
  reports.filter(Boolean).length !== 1 ||
  report.length !== 3
) {
  console.error('unexpected result');
  process.exit(1);
}
