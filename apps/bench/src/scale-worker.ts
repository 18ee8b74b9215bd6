/**
 * One process of the scale run: registers `jobs` per-second jobs on the scheduler (empty
 * handlers) with `decide` ('every-instance' or 'owner'), and counts what it asks of the database.
 * On SIGUSR2 it prints one JSON line of its counters so far (`mark`), so that the parent can take
 * the difference over its measuring window; on SIGTERM it stops and prints the final line: every
 * handler's tick and start latency (scheduled tick → handler start, on this process's clock), how many of
 * each outcome (every outcome is one decision), and the counters.
 *
 *   node scale-worker.mjs <database url> <schema> <jobs> <name> <decide>
 */
import { createScheduler, type SchedulerOptions } from '@lockkit/core';
import { createLockKit } from '@lockkit/pg';
import pg from 'pg';

const [url, schema, jobs, name, decide] = process.argv.slice(2) as [
  string,
  string,
  string,
  string,
  NonNullable<SchedulerOptions['decide']>,
];

/** Statements sent (one `query` call of the driver each) and transactions begun. */
const counters = { statements: 0, transactions: 0, decisions: 0, ran: 0 };
const query = pg.Client.prototype.query as (...args: unknown[]) => unknown;
pg.Client.prototype.query = function counted(this: pg.Client, ...args: unknown[]) {
  counters.statements++;
  const first = args[0];
  const text = typeof first === 'string' ? first : (first as { text?: unknown })?.text;
  if (typeof text === 'string' && /^\s*(BEGIN|START TRANSACTION)\b/i.test(text))
    counters.transactions++;
  return query.apply(this, args);
} as typeof pg.Client.prototype.query;

const pool = new pg.Pool({ connectionString: url, max: 10, application_name: `scale-${name}` });
pool.on('error', () => {});
const scheduler = createScheduler(createLockKit(pool, { schema }), { owner: name, decide });
/** [tick, ms from the tick to the handler's start], for every run. */
const latencies: [number, number][] = [];
const outcomes: Record<string, number> = {};
for (let j = 0; j < Number(jobs); j++) {
  scheduler.register(`scale-${j}`, '* * * * * *', (run) => {
    latencies.push([run.tick.getTime(), Date.now() - run.tick.getTime()]);
  });
}
for (const type of ['ran', 'skipped-held', 'skipped-done', 'failed', 'missed', 'error'] as const) {
  scheduler.on(type, () => {
    outcomes[type] = (outcomes[type] ?? 0) + 1;
    if (type !== 'error' && type !== 'missed') counters.decisions++;
    if (type === 'ran') counters.ran++;
  });
}
await scheduler.start();
process.stdout.write(`${JSON.stringify({ ready: true })}\n`);
process.on('SIGUSR2', () => {
  process.stdout.write(`${JSON.stringify({ mark: { ...counters, at: Date.now() } })}\n`);
});
process.once('SIGTERM', () => {
  void scheduler.stop({ timeoutMs: 5000 }).then(async () => {
    await pool.end();
    process.stdout.write(`${JSON.stringify({ latencies, outcomes, counters })}\n`);
    process.exit(0);
  });
});
