/**
 * Scale: several processes × many per-second jobs on one server, for some seconds, with the
 * scheduler's `decide` mode chosen. Reports, over a measuring window that starts once every
 * process is up: decisions, statements and transactions per due tick (counted in the workers;
 * transactions also from the server's `pg_stat_database`), the p50/p99 latency from a tick's
 * scheduled time to its handler's start, duplicate and missed ticks (from the ledger), and the
 * peak number of advisory locks in `pg_locks` — which must follow the jobs running at that
 * moment, never the jobs registered.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import type { SchedulerOptions } from '@lockkit/core';
import { createLockKit } from '@lockkit/pg';
import pg from 'pg';
import { percentile } from './measure.js';

/** How the scale run's schedulers decide (see `SchedulerOptions.decide`). */
export type ScaleDecide = NonNullable<SchedulerOptions['decide']>;

/** What one scale run measured. */
export interface ScaleReport {
  readonly decide: ScaleDecide;
  readonly processes: number;
  readonly jobsPerProcess: number;
  /** Length of the measuring window, in seconds. */
  readonly seconds: number;
  /** Due (job, tick) pairs in the window: jobs × seconds. */
  readonly dueTicks: number;
  /** Outcomes (ran, skipped-done, …) per due tick, over every process. */
  readonly decisionsPerTick: number;
  /** Statements sent (driver `query` calls) per due tick, over every process. */
  readonly statementsPerTick: number;
  /** Transactions begun per due tick, over every process (counted in the workers). */
  readonly transactionsPerTick: number;
  /** Transactions per due tick as the server counts them (`pg_stat_database`, whole database). */
  readonly serverTransactionsPerTick: number;
  /** Handlers started per second in the window. */
  readonly ranPerSecond: number;
  /** Scheduled tick → handler start, for ticks of the judged window. */
  readonly p50Ms: number;
  readonly p99Ms: number;
  /** Runs beyond one per tick (handler runs minus SUCCEEDED ledger rows). */
  readonly duplicates: number;
  /** Ticks of the judged window (window less 3 s at each end) without a SUCCEEDED row at the end. */
  readonly missed: number;
  readonly judgedTicks: number;
  readonly outcomes: Record<string, number>;
  readonly peakAdvisoryLocks: number;
  readonly peakGrantedAdvisoryLocks: number;
}

interface Counters {
  readonly statements: number;
  readonly transactions: number;
  readonly decisions: number;
  readonly ran: number;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Lines of a worker's output, parsed, as they come. */
function linesOf(child: ChildProcess): () => Record<string, unknown>[] {
  let text = '';
  child.stdout?.on('data', (chunk: Buffer) => {
    text += chunk.toString();
  });
  return () =>
    text
      .split('\n')
      .filter((l) => l.startsWith('{'))
      .map((l) => JSON.parse(l) as Record<string, unknown>);
}

/** Runs `processes` workers of `jobs` per-second jobs each for `seconds` against `url`. */
export async function measureScale(
  url: string,
  workerScript: string,
  processes: number,
  jobs: number,
  seconds: number,
  decide: ScaleDecide = 'every-instance',
): Promise<ScaleReport> {
  const schema = `lockkit_scale_${randomBytes(4).toString('hex')}`;
  const setup = new pg.Pool({ connectionString: url, max: 2 });
  setup.on('error', () => {});
  await createLockKit(setup, { schema }).migrate();
  const children = Array.from({ length: processes }, (_, i) =>
    spawn(process.execPath, [workerScript, url, schema, String(jobs), `p${i}`, decide], {
      stdio: ['ignore', 'pipe', 'inherit'],
    }),
  );
  const outputs = children.map(linesOf);
  const readyBy = Date.now() + 120_000;
  while (!outputs.every((o) => o().some((l) => l.ready === true))) {
    if (Date.now() > readyBy) throw new Error('scale workers did not start');
    await sleep(50);
  }
  const serverTransactions = async () => {
    const { rows } = await setup.query<{ n: string }>(
      `SELECT (xact_commit + xact_rollback)::text AS n FROM pg_stat_database
        WHERE datname = current_database()`,
    );
    return Number(rows[0]?.n ?? 0);
  };
  const marks = () =>
    outputs.map((o) => o().flatMap((l) => (l.mark === undefined ? [] : [l.mark as Counters])));
  // Settle: start-up registrations of the last worker to start are done, its timers armed.
  await sleep(2000);
  for (const child of children) child.kill('SIGUSR2');
  const xact0 = await serverTransactions();
  const from = Date.now();
  let peak = 0;
  let peakGranted = 0;
  const until = from + seconds * 1000;
  while (Date.now() < until) {
    const { rows } = await setup.query<{ all: number; granted: number }>(
      `SELECT count(*)::int AS all, count(*) FILTER (WHERE granted)::int AS granted
         FROM pg_locks WHERE locktype = 'advisory'`,
    );
    peak = Math.max(peak, rows[0]?.all ?? 0);
    peakGranted = Math.max(peakGranted, rows[0]?.granted ?? 0);
    await sleep(20);
  }
  for (const child of children) child.kill('SIGUSR2');
  const to = Date.now();
  // pg_stat_database is flushed by each backend at most once a second.
  const xact1 = await serverTransactions();
  const markedBy = Date.now() + 10_000;
  while (!marks().every((m) => m.length >= 2) && Date.now() < markedBy) await sleep(20);
  const exited = children.map((child) => new Promise((r) => child.once('exit', r)));
  for (const child of children) child.kill('SIGTERM');
  await Promise.all(exited);

  const delta = { statements: 0, transactions: 0, decisions: 0, ran: 0 };
  for (const m of marks()) {
    const [a, b] = m;
    if (!a || !b) throw new Error('a scale worker did not report its counters');
    for (const k of Object.keys(delta) as (keyof Counters)[]) delta[k] += b[k] - a[k];
  }
  const judgedFrom = Math.ceil(from / 1000) * 1000 + 3000;
  const judgedTo = Math.floor(to / 1000) * 1000 - 3000;
  const latencies: number[] = [];
  const outcomes: Record<string, number> = {};
  let handlerRuns = 0;
  for (const output of outputs) {
    const last = output().at(-1) ?? {};
    const r = last as { latencies?: [number, number][]; outcomes?: Record<string, number> };
    for (const [tick, ms] of r.latencies ?? []) {
      handlerRuns++;
      if (tick >= judgedFrom && tick <= judgedTo) latencies.push(ms);
    }
    for (const [k, n] of Object.entries(r.outcomes ?? {})) outcomes[k] = (outcomes[k] ?? 0) + n;
  }
  const [ledger] = (
    await setup.query<{ succeeded: number; missed: number; judged: number }>(
      `SELECT (SELECT count(*)::int FROM "${schema}".runs WHERE status = 'SUCCEEDED') AS succeeded,
              count(*) FILTER (WHERE NOT EXISTS (
                SELECT 1 FROM "${schema}".runs r
                 WHERE r.job = 'scale-' || j AND r.tick = t AND r.status = 'SUCCEEDED'))::int AS missed,
              count(*)::int AS judged
         FROM generate_series(0, $1::int - 1) AS j,
              generate_series($2::timestamptz, $3::timestamptz, interval '1 second') AS t`,
      [jobs, new Date(judgedFrom).toISOString(), new Date(judgedTo).toISOString()],
    )
  ).rows;
  await setup.query(`DROP SCHEMA "${schema}" CASCADE`);
  await setup.end();
  const window = (to - from) / 1000;
  const due = jobs * window;
  const per = (n: number) => Math.round((n / due) * 100) / 100;
  return {
    decide,
    processes,
    jobsPerProcess: jobs,
    seconds: Math.round(window * 10) / 10,
    dueTicks: Math.round(due),
    decisionsPerTick: per(delta.decisions),
    statementsPerTick: per(delta.statements),
    transactionsPerTick: per(delta.transactions),
    serverTransactionsPerTick: per(xact1 - xact0),
    ranPerSecond: Math.round(delta.ran / window),
    p50Ms: Math.round(percentile(latencies, 50)),
    p99Ms: Math.round(percentile(latencies, 99)),
    duplicates: handlerRuns - (ledger?.succeeded ?? 0),
    missed: ledger?.missed ?? 0,
    judgedTicks: ledger?.judged ?? 0,
    outcomes,
    peakAdvisoryLocks: peak,
    peakGrantedAdvisoryLocks: peakGranted,
  };
}

/** What the ceiling probe measured: small transactions the machine commits per second. */
export interface CeilingReport {
  readonly processes: number;
  readonly transactionsPerSecond: number;
  /** Statements per second (4 per transaction). */
  readonly statementsPerSecond: number;
}

/**
 * The machine's ceiling beside `processes` Node processes: each runs 10 loops of the skeleton of
 * a tick's claim (see ceiling-worker.ts) for `seconds`.
 */
export async function measureCeiling(
  url: string,
  workerScript: string,
  processes: number,
  seconds: number,
): Promise<CeilingReport> {
  const schema = `lockkit_ceiling_${randomBytes(4).toString('hex')}`;
  const setup = new pg.Pool({ connectionString: url, max: 1 });
  setup.on('error', () => {});
  await setup.query(`CREATE SCHEMA "${schema}"`);
  await setup.query(`CREATE TABLE "${schema}".ceiling (key text PRIMARY KEY, at timestamptz)`);
  const children = Array.from({ length: processes }, (_, i) =>
    spawn(process.execPath, [workerScript, url, schema, `c${i}`, '10'], {
      stdio: ['ignore', 'pipe', 'inherit'],
    }),
  );
  const outputs = children.map(linesOf);
  while (!outputs.every((o) => o().some((l) => l.ready === true))) await sleep(50);
  await sleep(1000);
  for (const child of children) child.kill('SIGUSR2');
  const from = Date.now();
  await sleep(seconds * 1000);
  for (const child of children) child.kill('SIGUSR2');
  const to = Date.now();
  const marks = () =>
    outputs.map((o) =>
      o().flatMap((l) => (l.mark === undefined ? [] : [l.mark as { committed: number }])),
    );
  while (!marks().every((m) => m.length >= 2)) await sleep(20);
  const exited = children.map((child) => new Promise((r) => child.once('exit', r)));
  for (const child of children) child.kill('SIGTERM');
  await Promise.all(exited);
  let committed = 0;
  for (const [a, b] of marks()) committed += (b?.committed ?? 0) - (a?.committed ?? 0);
  await setup.query(`DROP SCHEMA "${schema}" CASCADE`);
  await setup.end();
  const perSecond = committed / ((to - from) / 1000);
  return {
    processes,
    transactionsPerSecond: Math.round(perSecond),
    statementsPerSecond: Math.round(perSecond * 4),
  };
}
