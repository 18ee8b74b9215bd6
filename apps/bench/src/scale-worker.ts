/**
 * One process of the scale run: registers `jobs` per-second jobs on the scheduler (empty
 * handlers), and on SIGTERM prints one JSON line with every decision latency it saw — the time
 * from a scheduled tick to this process's outcome for it (ran, or skipped because another process
 * had it) — and how many of each outcome.
 *
 *   node scale-worker.mjs <database url> <schema> <jobs> <name>
 */
import { createScheduler } from '@lockkit/core';
import { createLockKit } from '@lockkit/pg';
import pg from 'pg';

const [url, schema, jobs, name] = process.argv.slice(2) as [string, string, string, string];
const pool = new pg.Pool({ connectionString: url, max: 10, application_name: `scale-${name}` });
pool.on('error', () => {});
const scheduler = createScheduler(createLockKit(pool, { schema }), { owner: name });
const latencies: number[] = [];
const outcomes: Record<string, number> = {};
for (let j = 0; j < Number(jobs); j++) {
  scheduler.register(`scale-${j}`, '* * * * * *', () => {});
}
for (const type of ['ran', 'skipped-held', 'skipped-done', 'failed', 'missed', 'error'] as const) {
  scheduler.on(type, (event) => {
    outcomes[type] = (outcomes[type] ?? 0) + 1;
    if ('tick' in event && type !== 'error') latencies.push(Date.now() - event.tick.getTime());
  });
}
await scheduler.start();
process.stdout.write(`${JSON.stringify({ ready: true })}\n`);
process.once('SIGTERM', () => {
  void scheduler.stop({ timeoutMs: 5000 }).then(async () => {
    await pool.end();
    process.stdout.write(`${JSON.stringify({ latencies, outcomes })}\n`);
    process.exit(0);
  });
});
