/**
 * One process of the scale run: registers `jobs` per-second jobs on the scheduler (handlers that
 * only note their start), and on SIGTERM prints one JSON line with what it saw from its `ready`
 * line on:
 * - `latencies`: every decision's latency — from a scheduled tick to this process's outcome for it
 *   (ran, or skipped because another process had it) — and `outcomes`, how many of each;
 * - `starts`: from a scheduled tick to its handler's start, for the ticks this process ran;
 * - `ran`: which ticks it ran, as flat pairs `[job, tick in epoch seconds, …]`;
 * - `wire`: the round trips, statements and transactions it sent its server;
 * - `trace` (with LOCKKIT_BENCH_SCALE_TRACE=1): how often each statement was sent, by its text;
 * - `readyAt` and `stoppedAt` (epoch ms): the window those cover.
 *
 *   node scale-worker.mjs <database url> <schema> <jobs> <name> [every-instance|owned]
 */
import { createScheduler } from '@lockkit/core';
import { createLockKit } from '@lockkit/pg';
import pg from 'pg';
import { WireCount } from './wire-count.js';

const [url, schema, jobs, name, distribution = 'every-instance'] = process.argv.slice(2) as [
  string,
  string,
  string,
  string,
  string | undefined,
];
if (distribution !== 'every-instance' && distribution !== 'owned')
  throw new Error(`distribution must be 'every-instance' or 'owned', not '${distribution}'`);
// LOCKKIT_BENCH_SCALE_TRACE=1: the report also counts each statement sent, by its text.
const wire = WireCount.install(process.env.LOCKKIT_BENCH_SCALE_TRACE === '1');
const pool = new pg.Pool({ connectionString: url, max: 10, application_name: `scale-${name}` });
pool.on('error', () => {});
const scheduler = createScheduler(createLockKit(pool, { schema }), { owner: name, distribution });
const latencies: number[] = [];
const starts: number[] = [];
const ran: number[] = [];
const outcomes: Record<string, number> = {};
for (let j = 0; j < Number(jobs); j++) {
  scheduler.register(`scale-${j}`, '* * * * * *', (run) => {
    starts.push(Date.now() - run.tick.getTime());
    ran.push(j, run.tick.getTime() / 1000);
  });
}
for (const type of ['ran', 'skipped-held', 'skipped-done', 'failed', 'missed', 'error'] as const) {
  scheduler.on(type, (event) => {
    outcomes[type] = (outcomes[type] ?? 0) + 1;
    if ('tick' in event && type !== 'error') latencies.push(Date.now() - event.tick.getTime());
  });
}
await scheduler.start();
// Registration and start-up are not part of the window.
wire.reset();
const readyAt = Date.now();
process.stdout.write(`${JSON.stringify({ ready: true, readyAt })}\n`);
process.once('SIGTERM', () => {
  const stoppedAt = Date.now();
  const totals = wire.totals();
  void scheduler.stop({ timeoutMs: 5000 }).then(async () => {
    await pool.end();
    process.stdout.write(
      `${JSON.stringify({
        latencies,
        starts,
        ran,
        outcomes,
        wire: totals,
        trace: wire.trace === undefined ? undefined : Object.fromEntries(wire.trace),
        readyAt,
        stoppedAt,
      })}\n`,
      () => process.exit(0),
    );
  });
});
