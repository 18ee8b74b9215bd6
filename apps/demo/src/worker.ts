/**
 * One demo worker process: registers the demo's jobs through the chosen adapter, with its clock
 * skewed, records each execution inside the run, and reports every outcome to the parent as one
 * JSON line on stdout. SIGTERM stops it cleanly.
 */
import { createScheduler, SCHEDULER_OUTCOMES } from '@lockkit/core';
import { type AdapterName, connect } from './adapters.js';
import { JOBS } from './jobs.js';

interface WorkerConfig {
  readonly adapter: AdapterName;
  readonly url: string;
  readonly schema: string;
  readonly skewMs: number;
  readonly worker: string;
}

const say = (message: Record<string, unknown>) =>
  process.stdout.write(`${JSON.stringify(message)}\n`);

async function main(): Promise<void> {
  const config = JSON.parse(process.argv[2] ?? '{}') as WorkerConfig;
  // Named in pg_stat_activity, so that the dashboard and `lockkit locks` show who holds a lock.
  const url = new URL(config.url);
  url.searchParams.set('application_name', `lockkit-demo-${config.worker}`);
  const { locks, close } = connect(config.adapter, url.toString(), config.schema);
  const scheduler = createScheduler(locks, {
    owner: config.worker,
    now: () => Date.now() + config.skewMs,
    catchUpGraceMs: 3000,
  });
  const record = `INSERT INTO "${config.schema}".executions (job, tick, worker) VALUES ($1, $2, $3)`;
  for (const job of JOBS) {
    scheduler.register(
      job.name,
      job.cron,
      async (run) => {
        if (run.mode === 'transaction') {
          await new Promise((r) => setTimeout(r, job.workMs));
          await run.query(record, [job.name, run.tick.toISOString(), config.worker]);
        } else {
          say({
            type: 'lease',
            job: job.name,
            tick: run.tick.getTime(),
            token: String(run.lease.token),
          });
          await new Promise((r) => setTimeout(r, job.workMs));
          await run.lease.fenced((_tx, query) =>
            query(record, [job.name, run.tick.toISOString(), config.worker]),
          );
        }
      },
      { mode: job.mode, ...(job.mode === 'lease' && { lease: { ttlMs: 4000 } }) },
    );
  }
  for (const type of [...SCHEDULER_OUTCOMES, 'error'] as const) {
    scheduler.on(type, (event) => {
      const tick = 'tick' in event ? event.tick.getTime() : undefined;
      say({ type, job: event.job, tick, ...('error' in event && { error: String(event.error) }) });
    });
  }
  await scheduler.start();
  say({ type: 'ready' });
  process.once('SIGTERM', () => {
    void scheduler.stop({ timeoutMs: 5000 }).then(async () => {
      await close();
      process.exit(0);
    });
  });
}

main().catch((error: unknown) => {
  say({ type: 'fatal', error: String(error) });
  process.exit(1);
});
