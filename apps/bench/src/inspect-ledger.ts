/**
 * `node dist/inspect-ledger.mjs`: what one `inspect()` call costs on a large scheduler ledger.
 *
 * Fills a fresh schema with `--rows` ledger rows (default 1,200,000: two per-second jobs kept for
 * the default retention of 7 days — ~1 % failed, ~1 % missed, ~1 % skipped), ANALYZEs it, then
 * times `--iterations` calls of `inspect()` (after two warm-up calls) and prints the median, p95
 * and max, plus the number of rows of the call's answer (`--window`: the per-job rows counted,
 * `jobWindow`, default 1000). The schema is dropped afterwards.
 *
 * Settings: `DATABASE_URL` (else an embedded PostgreSQL is started).
 */
import { randomBytes } from 'node:crypto';
import { parseArgs } from 'node:util';
import { inspect } from '@lockkit/core';
import { createLockKit, pgExecutor } from '@lockkit/pg';
import { startEmbeddedPostgres } from '@lockkit/test-db/embedded';
import pg from 'pg';
import { percentile } from './measure.js';

const { values } = parseArgs({
  options: {
    rows: { type: 'string', default: '1200000' },
    jobs: { type: 'string', default: '2' },
    iterations: { type: 'string', default: '30' },
    window: { type: 'string', default: '1000' },
  },
});
const rows = Number(values.rows);
const jobs = Number(values.jobs);
const iterations = Number(values.iterations);
const jobWindow = Number(values.window);
if (![rows, jobs, iterations, jobWindow].every((n) => Number.isInteger(n) && n > 0)) {
  console.error(
    'usage: inspect-ledger [--rows N] [--jobs N] [--iterations N] [--window N] (positive integers)',
  );
  process.exit(2);
}

const embedded = process.env.DATABASE_URL ? undefined : await startEmbeddedPostgres();
const url = process.env.DATABASE_URL ?? (embedded?.url as string);
const schema = `lockkit_inspect_bench_${randomBytes(4).toString('hex')}`;
const pool = new pg.Pool({ connectionString: url, max: 2 });
try {
  await createLockKit(pool, { schema }).migrate();
  const perJob = Math.ceil(rows / jobs);
  const filled = performance.now();
  // One row per job and second, newest at now(): statuses spread like a healthy week.
  await pool.query(
    `INSERT INTO "${schema}".runs (job, tick, status, owner, attempt, started_at, finished_at, error)
     SELECT 'job-' || j, date_trunc('second', now()) - make_interval(secs => s),
            CASE WHEN s % 97 = 0 THEN 'FAILED' WHEN s % 101 = 0 THEN 'MISSED'
                 WHEN s % 103 = 0 THEN 'SKIPPED_OVERLAP' ELSE 'SUCCEEDED' END,
            'host-' || (s % 3) || ':' || (1000 + j), 1,
            date_trunc('second', now()) - make_interval(secs => s),
            date_trunc('second', now()) - make_interval(secs => s) + interval '20 ms',
            CASE WHEN s % 97 = 0 THEN 'boom' END
       FROM generate_series(1, $1::int) AS j, generate_series(0, $2::int - 1) AS s`,
    [jobs, perJob],
  );
  await pool.query(`ANALYZE "${schema}".runs`);
  const { rows: count } = await pool.query(`SELECT count(*)::int AS n FROM "${schema}".runs`);
  console.log(
    `ledger: ${count[0].n} rows, ${jobs} jobs (filled in ${Math.round(performance.now() - filled)} ms)`,
  );
  const executor = pgExecutor(pool);
  for (let i = 0; i < 2; i++) await inspect(executor, { schema, jobWindow });
  const times: number[] = [];
  let answer = { jobs: 0, recentRuns: 0 };
  for (let i = 0; i < iterations; i++) {
    const started = performance.now();
    const seen = await inspect(executor, { schema, jobWindow });
    times.push(performance.now() - started);
    answer = { jobs: seen.jobs.length, recentRuns: seen.recentRuns.length };
  }
  times.sort((a, b) => a - b);
  const f = (ms: number) => `${ms.toFixed(1)} ms`;
  console.log(
    `inspect() (jobWindow ${jobWindow}) over ${iterations} calls: median ${f(percentile(times, 50))}, p95 ${f(percentile(times, 95))}, max ${f(times.at(-1) ?? 0)}; answer: ${answer.jobs} jobs, ${answer.recentRuns} recent runs`,
  );
} finally {
  await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`).catch(() => {});
  await pool.end();
  await embedded?.stop();
}
