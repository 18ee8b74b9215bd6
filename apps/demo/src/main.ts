/**
 * `pnpm demo`: several worker processes with skewed clocks run the same cron jobs on one Postgres;
 * each tick runs exactly once, even when a worker is killed midway. Ends with a verdict read from
 * the database.
 *
 *   pnpm demo [--workers 4] [--seconds 20] [--skew-ms 800] [--kill auto|none|<n>]
 *             [--adapter pg|postgres|prisma|drizzle|kysely] [--url postgres://…] [--json]
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { startDashboard } from '@lockkit/cli/dashboard';
import { pgExecutor } from '@lockkit/pg';
import { startEmbeddedPostgres } from '@lockkit/test-db/embedded';
import pg from 'pg';
import { ADAPTERS, type AdapterName, connect } from './adapters.js';
import { JOBS } from './jobs.js';
import { onJsonLines } from './json-lines.js';
import { adapterOption, integerOption } from './options.js';

const USAGE = `Usage: pnpm demo [options]
  --workers N        worker processes (default 4)
  --seconds N        how long to run (default 20)
  --skew-ms N        clocks spread over ±N ms (default 800)
  --kill WHICH       auto (the worker whose clock runs ahead, midway), none, or a worker number
  --adapter NAME     ${ADAPTERS.join(' | ')} (default pg)
  --url URL          PostgreSQL to use (default: $DATABASE_URL, else an embedded server)
  --json             print only the verdict, as one JSON object on the last line
  --dashboard PORT   also serve the live dashboard on 127.0.0.1:PORT (0 picks a free port)
`;

interface Options {
  workers: number;
  seconds: number;
  skewMs: number;
  kill: 'auto' | 'none' | number;
  adapter: AdapterName;
  url: string | undefined;
  json: boolean;
  dashboard: number | undefined;
}

function options(): Options {
  const { values } = parseArgs({
    options: {
      workers: { type: 'string', default: '4' },
      seconds: { type: 'string', default: '20' },
      'skew-ms': { type: 'string', default: '800' },
      kill: { type: 'string', default: 'auto' },
      adapter: { type: 'string', default: 'pg' },
      url: { type: 'string' },
      json: { type: 'boolean', default: false },
      dashboard: { type: 'string' },
      help: { type: 'boolean', short: 'h', default: false },
    },
  });
  if (values.help) {
    process.stdout.write(USAGE);
    process.exit(0);
  }
  const int = integerOption;
  const workers = int('workers', values.workers, 1, 32);
  const adapter = adapterOption(values.adapter);
  const kill =
    values.kill === 'auto' || values.kill === 'none'
      ? values.kill
      : int('kill', values.kill, 0, workers - 1);
  return {
    workers,
    seconds: int('seconds', values.seconds, 8, 3600),
    skewMs: int('skew-ms', values['skew-ms'], 0, 900),
    kill,
    adapter,
    url: values.url ?? process.env.DATABASE_URL,
    json: values.json,
    dashboard:
      values.dashboard === undefined ? undefined : int('dashboard', values.dashboard, 0, 65535),
  };
}

interface WorkerState {
  readonly name: string;
  readonly skewMs: number;
  readonly process: ChildProcess;
  ran: number;
  skipped: number;
  leaseHeld: string;
  alive: boolean;
  ready: boolean;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function main(): Promise<void> {
  const o = options();
  const log = (line: string) => {
    if (!o.json) process.stdout.write(`${line}\n`);
  };
  let embedded: Awaited<ReturnType<typeof startEmbeddedPostgres>> | undefined;
  const workers: WorkerState[] = [];
  let admin: pg.Client | undefined;
  const schema = `lockkit_demo_${randomBytes(4).toString('hex')}`;
  let cleaned = false;
  const extraCleanups: (() => Promise<void>)[] = [];
  const cleanup = async () => {
    if (cleaned) return;
    cleaned = true;
    for (const extra of extraCleanups) await extra().catch(() => {});
    for (const w of workers) if (w.alive) w.process.kill('SIGTERM');
    await Promise.all(
      workers.map((w) => (w.alive ? new Promise((r) => w.process.once('exit', r)) : null)),
    );
    if (admin) {
      await admin.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`).catch(() => {});
      await admin.end().catch(() => {});
    }
    await embedded?.stop();
  };
  process.once('SIGINT', () => {
    process.stderr.write('\nstopping…\n');
    void cleanup().then(() => process.exit(130));
  });
  try {
    await run(
      o,
      workers,
      schema,
      (client) => {
        admin = client;
      },
      (server) => {
        embedded = server;
      },
      log,
      cleanup,
      (extra) => extraCleanups.push(extra),
    );
  } finally {
    await cleanup();
  }
}

async function run(
  o: Options,
  workers: WorkerState[],
  schema: string,
  setAdmin: (client: pg.Client) => void,
  setEmbedded: (server: Awaited<ReturnType<typeof startEmbeddedPostgres>>) => void,
  log: (line: string) => void,
  cleanup: () => Promise<void>,
  onCleanup: (extra: () => Promise<void>) => void,
): Promise<void> {
  let url = o.url;
  if (!url) {
    log('starting an embedded PostgreSQL (no --url, no DATABASE_URL)…');
    const embedded = await startEmbeddedPostgres();
    setEmbedded(embedded);
    url = embedded.url;
  }
  const admin = new pg.Client({ connectionString: url, application_name: 'lockkit-demo' });
  setAdmin(admin);
  await admin.connect();
  const setup = connect(o.adapter, url, schema);
  await setup.locks.migrate();
  await setup.close();
  log(`tables ready in schema ${schema}`);
  await admin.query(
    `CREATE TABLE "${schema}".executions (job text NOT NULL, tick timestamptz NOT NULL, worker text NOT NULL)`,
  );
  if (o.dashboard !== undefined) {
    const pool = new pg.Pool({
      connectionString: url,
      max: 2,
      application_name: 'lockkit-dashboard',
    });
    pool.on('error', () => {});
    const dashboard = await startDashboard({
      executor: pgExecutor(pool),
      schema,
      port: o.dashboard,
      intervalMs: 500,
    });
    onCleanup(async () => {
      await dashboard.close();
      await pool.end();
    });
    process.stdout.write(`dashboard: ${dashboard.url}\n`);
  }

  // Clocks spread evenly over ±skew.
  const skews = Array.from({ length: o.workers }, (_, i) =>
    o.workers === 1 ? 0 : Math.round(-o.skewMs + (2 * o.skewMs * i) / (o.workers - 1)),
  );
  const workerFile = fileURLToPath(new URL('./worker.mjs', import.meta.url));
  const ticksPerJob = new Map<string, Set<number>>(JOBS.map((j) => [j.name, new Set()]));
  for (const [i, skewMs] of skews.entries()) {
    const child = spawn(
      process.execPath,
      [workerFile, JSON.stringify({ adapter: o.adapter, url, schema, skewMs, worker: `w${i}` })],
      {
        stdio: ['ignore', 'pipe', 'inherit'],
      },
    );
    const state: WorkerState = {
      name: `w${i}`,
      skewMs,
      process: child,
      ran: 0,
      skipped: 0,
      leaseHeld: '',
      alive: true,
      ready: false,
    };
    workers.push(state);
    child.once('exit', () => {
      state.alive = false;
    });
    onJsonLines<{ type: string; job?: string; tick?: number; error?: string }>(
      child.stdout,
      (message) => {
        if (message.type === 'ready') state.ready = true;
        if (message.type === 'ran') {
          state.ran++;
          if (message.job && message.tick) ticksPerJob.get(message.job)?.add(message.tick);
          if (message.job === 'nightly-report') state.leaseHeld = '';
        }
        if (message.type === 'skipped-done' || message.type === 'skipped-held') state.skipped++;
        if (message.type === 'lease')
          state.leaseHeld = `${message.job} @${new Date(message.tick ?? 0).toISOString().slice(11, 19)}`;
        if (message.type === 'fatal') process.stderr.write(`${state.name}: ${message.error}\n`);
      },
    );
  }
  const readyBy = Date.now() + 30_000;
  while (!workers.every((w) => w.ready || !w.alive)) {
    if (Date.now() > readyBy || workers.some((w) => !w.alive))
      throw new Error('a worker failed to start');
    await sleep(50);
  }
  const started = Date.now();
  // Judge only ticks every worker was up for (their clocks included), and leave the last ones to finish.
  const windowStart = Math.ceil((started + o.skewMs) / 1000) * 1000 + 1000;
  const victim =
    o.kill === 'none' ? undefined : o.kill === 'auto' ? skews.indexOf(Math.max(...skews)) : o.kill;
  let killedAt: number | undefined;
  const deadline = started + o.seconds * 1000;
  // A terminal gets a live view redrawn in place; a pipe or a file gets a plain line every 2 s.
  const live = process.stdout.isTTY === true;
  const elapsed = () => Math.round((Date.now() - started) / 1000);
  const at = () => `${String(elapsed()).padStart(4)}/${o.seconds} s`;
  let nextLine = 2;
  if (!live) {
    log(headline(o, victim, undefined));
    log(
      `  clocks: ${workers.map((w) => `${w.name} ${w.skewMs >= 0 ? '+' : ''}${w.skewMs} ms`).join(', ')}`,
    );
  }
  while (Date.now() < deadline) {
    if (
      victim !== undefined &&
      killedAt === undefined &&
      Date.now() >= started + (o.seconds * 1000) / 2
    ) {
      workers[victim]?.process.kill('SIGKILL');
      killedAt = Date.now();
      if (!live) log(`${at()}  w${victim} killed`);
    }
    if (!o.json && live) render(workers, ticksPerJob, elapsed(), o, victim, killedAt);
    if (!live && elapsed() >= nextLine) {
      log(`${at()}  ${progress(workers, ticksPerJob)}`);
      nextLine = elapsed() + 2;
    }
    await sleep(500);
  }
  const windowEnd = Math.floor(Date.now() / 1000) * 1000 - 3000;
  for (const w of workers) if (w.alive) w.process.kill('SIGTERM');
  await Promise.all(
    workers.map((w) => (w.alive ? new Promise((r) => w.process.once('exit', r)) : null)),
  );

  const verdict = await judge(admin, schema, windowStart, windowEnd);
  const result = {
    adapter: o.adapter,
    workers: o.workers,
    killed: victim === undefined ? null : `w${victim}`,
    ticksDue: verdict.due,
    ticksRun: verdict.run,
    duplicates: verdict.duplicates,
    missed: verdict.missed,
    lease: verdict.lease,
  };
  await cleanup();
  if (o.json) {
    process.stdout.write(`${JSON.stringify(result)}\n`);
  } else {
    log('');
    log(
      `verdict (ticks from ${new Date(windowStart).toISOString().slice(11, 19)} to ${new Date(windowEnd).toISOString().slice(11, 19)}, transaction-mode jobs):`,
    );
    log(
      `  ticks due ${result.ticksDue}, ticks run ${result.ticksRun}, duplicates ${result.duplicates}, missed ${result.missed}`,
    );
    log(
      `  lease job nightly-report: ${verdict.lease.runs} runs, ${verdict.lease.duplicates} duplicates, ${verdict.lease.abandoned} abandoned by the killed worker`,
    );
    log(
      result.duplicates === 0 && result.missed === 0
        ? '  ✔ every tick ran exactly once'
        : '  ✘ exactly-once was violated',
    );
  }
  process.exitCode = result.duplicates === 0 && result.missed === 0 ? 0 : 1;
}

/** Reads the verdict from the database: every due tick of the transaction-mode jobs, exactly once. */
async function judge(admin: pg.Client, schema: string, from: number, to: number) {
  let due = 0;
  let run = 0;
  let duplicates = 0;
  let missed = 0;
  for (const job of JOBS.filter((j) => j.mode === 'transaction')) {
    const { rows } = await admin.query<{ tick: Date; n: number }>(
      `SELECT tick, count(*)::int AS n FROM "${schema}".executions WHERE job = $1 AND tick BETWEEN $2 AND $3 GROUP BY tick`,
      [job.name, new Date(from).toISOString(), new Date(to).toISOString()],
    );
    const counts = new Map(rows.map((r) => [new Date(r.tick).getTime(), r.n]));
    for (
      let t = Math.ceil(from / (job.everySeconds * 1000)) * job.everySeconds * 1000;
      t <= to;
      t += job.everySeconds * 1000
    ) {
      due++;
      const n = counts.get(t) ?? 0;
      if (n === 0) missed++;
      else run++;
      if (n > 1) duplicates += n - 1;
    }
  }
  const lease = JOBS.find((j) => j.mode === 'lease') as (typeof JOBS)[number];
  const { rows: leaseRows } = await admin.query<{ runs: number; dupes: number }>(
    `SELECT count(*)::int AS runs, coalesce(sum(n - 1), 0)::int AS dupes FROM
       (SELECT tick, count(*) AS n FROM "${schema}".executions WHERE job = $1 GROUP BY tick) t`,
    [lease.name],
  );
  const { rows: abandoned } = await admin.query<{ n: number }>(
    `SELECT count(*)::int AS n FROM "${schema}".runs WHERE job = $1 AND status IN ('ABANDONED', 'RUNNING')`,
    [lease.name],
  );
  return {
    due,
    run,
    duplicates,
    missed,
    lease: {
      runs: leaseRows[0]?.runs ?? 0,
      duplicates: leaseRows[0]?.dupes ?? 0,
      abandoned: abandoned[0]?.n ?? 0,
    },
  };
}

/** The first line of the live view, and of the plain output. */
function headline(
  o: Options,
  victim: number | undefined,
  killedAt: number | undefined,
  elapsed?: number,
): string {
  const time = elapsed === undefined ? `${o.seconds} s` : `${elapsed}/${o.seconds} s`;
  const base = `lockkit demo — ${o.workers} workers on @lockkit/${o.adapter}, clocks ±${o.skewMs} ms, ${time}`;
  if (victim === undefined) return base;
  return killedAt
    ? `${base}   ✝ w${victim} was killed`
    : `${base}   (w${victim} will be killed midway)`;
}

/** One plain progress line: runs and skips over all workers, ticks run per job. */
function progress(workers: readonly WorkerState[], ticks: Map<string, Set<number>>): string {
  const ran = workers.reduce((n, w) => n + w.ran, 0);
  const skipped = workers.reduce((n, w) => n + w.skipped, 0);
  const perJob = JOBS.map((j) => `${j.name} ${ticks.get(j.name)?.size ?? 0}`).join(', ');
  return `ran ${ran}, skipped ${skipped}; ticks run: ${perJob}`;
}

/** The live view on a terminal: the screen is cleared and redrawn every half second. */
function render(
  workers: readonly WorkerState[],
  ticks: Map<string, Set<number>>,
  elapsed: number,
  o: Options,
  victim: number | undefined,
  killedAt: number | undefined,
): void {
  const lines = [
    headline(o, victim, killedAt, elapsed),
    '',
    'worker  clock      ran  skipped  lease held',
    ...workers.map(
      (w) =>
        `${w.name.padEnd(6)}  ${`${w.skewMs >= 0 ? '+' : ''}${w.skewMs} ms`.padEnd(9)}  ${String(w.ran).padStart(3)}  ${String(w.skipped).padStart(7)}  ${w.alive ? w.leaseHeld || '-' : 'KILLED'}`,
    ),
    '',
    'job                 mode         ticks run',
    ...JOBS.map(
      (j) =>
        `${j.name.padEnd(18)}  ${j.mode.padEnd(11)}  ${String(ticks.get(j.name)?.size ?? 0).padStart(9)}`,
    ),
  ];
  process.stdout.write(`\x1b[2J\x1b[H${lines.join('\n')}\n`);
}

main().catch(async (error: unknown) => {
  process.stderr.write(
    `lockkit demo failed: ${error instanceof Error ? error.message : String(error)}\n`,
  );
  process.exit(1);
});
