/**
 * A worker process for the scheduler group: registers per-second jobs through the adapter under
 * test, with its clock skewed by `skewMs`, records every execution, and runs until SIGTERM (clean
 * stop) or SIGKILL.
 *
 * Usage: node scheduler-worker.mjs '<json>' with { module, url, schema, namespace, skewMs, jobs,
 * worker, decide?, membership? } (the scheduler options of the same names): the namespace scopes
 * its lock keys to the test (another suite on the same server runs the same job names).
 */
import { pathToFileURL } from 'node:url';
import { createLockClient, createScheduler, type SchedulerOptions } from '@lockkit/core';
import type { AdapterInstance } from './harness.js';

interface WorkerConfig {
  readonly module: string;
  readonly url: string;
  readonly schema: string;
  readonly namespace: string;
  readonly skewMs: number;
  readonly jobs: readonly string[];
  readonly worker: string;
  readonly decide?: SchedulerOptions['decide'];
  readonly membership?: SchedulerOptions['membership'];
}

async function main(): Promise<void> {
  const config = JSON.parse(process.argv[2] ?? '{}') as WorkerConfig;
  const adapter = (await import(pathToFileURL(config.module).href)) as {
    createInstance(options: { url: string; poolSize: number }): AdapterInstance<unknown, unknown>;
  };
  const instance = adapter.createInstance({ url: config.url, poolSize: 8 });
  const locks = createLockClient(instance.executor, { schema: config.schema });
  const scheduler = createScheduler(locks, {
    owner: config.worker,
    namespace: config.namespace,
    now: () => Date.now() + config.skewMs,
    catchUpGraceMs: 3000,
    ...(config.decide !== undefined && { decide: config.decide }),
    ...(config.membership !== undefined && { membership: config.membership }),
  });
  for (const job of config.jobs) {
    scheduler.register(job, '* * * * * *', async (run) => {
      if (run.mode !== 'transaction') throw new Error('expected a transaction-mode run');
      // A little work inside the run's transaction, so that runs of one tick would overlap.
      await new Promise((r) => setTimeout(r, Math.floor(Math.random() * 40)));
      await run.query(
        `INSERT INTO "${config.schema}".executions (job, tick, worker) VALUES ($1, $2, $3)`,
        [job, run.tick.toISOString(), config.worker],
      );
    });
  }
  scheduler.on('error', (e) =>
    process.stderr.write(`[${config.worker}] error ${e.job} ${String(e.error)}\n`),
  );
  await scheduler.start();
  process.stdout.write('READY\n');
  process.once('SIGTERM', () => {
    void scheduler.stop({ timeoutMs: 5000 }).then(async () => {
      await instance.close();
      process.exit(0);
    });
  });
}

main().catch((error: unknown) => {
  process.stdout.write(`ERROR ${String(error)}\n`);
  process.exitCode = 1;
});
