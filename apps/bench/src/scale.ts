/**
 * Scale: several processes × many per-second jobs on one server, for some seconds. Reports, over
 * the window in which every process was up:
 * - per tick (one tick a second for every job): decisions, and the round trips, statements and
 *   transactions all processes sent (counted in each process, see wire-count.ts);
 * - latency: decisions (scheduled tick → a process's outcome for it) and handler starts
 *   (scheduled tick → the handler running), p50 and p99;
 * - exactly-once: ticks whose handler ran twice, and ticks of the window no handler ran by the end;
 * - the peak number of advisory locks in `pg_locks`, which must follow the jobs running at that
 *   moment, never the jobs registered.
 * {@link measureCeiling} measures, the same way, what the server commits beside as many processes
 * when each transaction is as small as a run can be: the ceiling a scheduler can be held to.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { createLockKit } from '@lockkit/pg';
import pg from 'pg';
import { percentile } from './measure.js';

/** What one scale run measured. */
export interface ScaleReport {
  /** Which instances decided each tick: every one, or the job's owner (SchedulerOptions). */
  readonly distribution: ScaleDistribution;
  readonly processes: number;
  readonly jobsPerProcess: number;
  readonly seconds: number;
  readonly decisions: number;
  readonly outcomes: Record<string, number>;
  readonly p50Ms: number;
  readonly p99Ms: number;
  /** Per tick of the window, over all processes. */
  readonly perTick: {
    readonly decisions: number;
    readonly roundTrips: number;
    readonly statements: number;
    readonly transactions: number;
  };
  /** From a scheduled tick to its handler's start. */
  readonly handlerStartP50Ms: number;
  readonly handlerStartP99Ms: number;
  /** Handler runs over all processes. */
  readonly runs: number;
  /** Ticks whose handler ran more than once. */
  readonly duplicates: number;
  /** Ticks of the window (see {@link ScaleReport.window}) no handler had run when it ended. */
  readonly notRun: number;
  /** The ticks checked for `notRun`: every job's ticks from `from` to `to` (epoch seconds). */
  readonly window: { readonly from: number; readonly to: number; readonly ticks: number };
  readonly peakAdvisoryLocks: number;
  readonly peakGrantedAdvisoryLocks: number;
  /** With LOCKKIT_BENCH_SCALE_TRACE=1: each statement's count per tick, over all processes. */
  readonly tracePerTick?: Record<string, number>;
}

/** What a worker prints when it stops. */
interface WorkerReport {
  readonly latencies?: number[];
  readonly starts?: number[];
  readonly ran?: number[];
  readonly outcomes?: Record<string, number>;
  readonly wire?: { roundTrips: number; statements: number; transactions: number };
  readonly readyAt?: number;
  readonly stoppedAt?: number;
  readonly commits?: number;
  readonly trace?: Record<string, number>;
}

/** Spawns `count` workers, waits for every `ready` line, and returns their outputs and stop. */
async function spawnWorkers(
  count: number,
  args: (i: number) => string[],
): Promise<{ stop: () => Promise<WorkerReport[]> }> {
  const children: ChildProcess[] = Array.from({ length: count }, (_, i) =>
    spawn(process.execPath, args(i), { stdio: ['ignore', 'pipe', 'inherit'] }),
  );
  const outputs = children.map((child) => {
    let text = '';
    child.stdout?.on('data', (chunk: Buffer) => {
      text += chunk.toString();
    });
    return () => text;
  });
  // 'close', not 'exit': the report may still be in the pipe when the process has exited.
  const exited = children.map((child) => new Promise((r) => child.once('close', r)));
  const readyBy = Date.now() + 120_000;
  while (!outputs.every((o) => o().includes('"ready"'))) {
    if (Date.now() > readyBy) {
      for (const child of children) child.kill('SIGKILL');
      throw new Error('scale workers did not start');
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  return {
    stop: async () => {
      for (const child of children) child.kill('SIGTERM');
      await Promise.all(exited);
      return outputs.map(
        (output) => JSON.parse(output().trim().split('\n').at(-1) ?? '{}') as WorkerReport,
      );
    },
  };
}

/** What the workers' handler runs add up to (see {@link ScaleReport}). */
function tally(reports: readonly WorkerReport[], jobs: number) {
  const starts: number[] = [];
  const runsOf = new Map<number, number>(); // job * 2^32 + tick second → handler runs
  let runs = 0;
  for (const r of reports) {
    starts.push(...(r.starts ?? []));
    const ran = r.ran ?? [];
    for (let i = 0; i + 1 < ran.length; i += 2) {
      const id = (ran[i] as number) * 2 ** 32 + (ran[i + 1] as number);
      runsOf.set(id, (runsOf.get(id) ?? 0) + 1);
      runs++;
    }
  }
  // The window every process covered: from the last `ready` to the first SIGTERM.
  const from = Math.ceil(Math.max(...reports.map((r) => r.readyAt ?? 0)) / 1000);
  const stoppedAt = Math.min(...reports.map((r) => r.stoppedAt ?? Number.POSITIVE_INFINITY));
  const to = Math.floor(stoppedAt / 1000) - 1;
  const windowSeconds = Math.max(1, (stoppedAt - from * 1000) / 1000);
  let notRun = 0;
  let runsInWindow = 0;
  for (let job = 0; job < jobs; job++)
    for (let tick = from; tick <= to; tick++) {
      const n = runsOf.get(job * 2 ** 32 + tick);
      if (n === undefined) notRun++;
      else runsInWindow += n;
    }
  let duplicates = 0;
  for (const n of runsOf.values()) if (n > 1) duplicates++;
  return {
    starts,
    runs,
    runsInWindow,
    duplicates,
    notRun,
    window: { from, to, ticks: Math.max(0, to - from + 1) * jobs },
    windowSeconds,
  };
}

/**
 * Runs `measure` against a scratch schema named `<prefix>_<random>`, made by `create` on a small
 * pool of its own, and drops the schema afterwards, whatever happened (the pool is closed too).
 */
async function withScratchSchema<T>(
  url: string,
  prefix: string,
  create: (setup: pg.Pool, schema: string) => Promise<unknown>,
  measure: (setup: pg.Pool, schema: string) => Promise<T>,
): Promise<T> {
  const schema = `${prefix}_${randomBytes(4).toString('hex')}`;
  const setup = new pg.Pool({ connectionString: url, max: 2 });
  try {
    await create(setup, schema);
    return await measure(setup, schema);
  } finally {
    await setup.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
    await setup.end();
  }
}

/** The scheduler's `distribution` option, as the scale run takes it. */
export type ScaleDistribution = 'every-instance' | 'owned';

/** Runs `processes` workers of `jobs` per-second jobs each for `seconds` against `url`. */
export async function measureScale(
  url: string,
  workerScript: string,
  processes: number,
  jobs: number,
  seconds: number,
  distribution: ScaleDistribution = 'every-instance',
): Promise<ScaleReport> {
  return withScratchSchema(
    url,
    'lockkit_scale',
    (setup, schema) => createLockKit(setup, { schema }).migrate(),
    async (setup, schema) => {
      const workers = await spawnWorkers(processes, (i) => [
        workerScript,
        url,
        schema,
        String(jobs),
        `p${i}`,
        distribution,
      ]);
      let peak = 0;
      let peakGranted = 0;
      const until = Date.now() + seconds * 1000;
      while (Date.now() < until) {
        const { rows } = await setup.query<{ all: number; granted: number }>(
          `SELECT count(*)::int AS all, count(*) FILTER (WHERE granted)::int AS granted
           FROM pg_locks WHERE locktype = 'advisory'`,
        );
        peak = Math.max(peak, rows[0]?.all ?? 0);
        peakGranted = Math.max(peakGranted, rows[0]?.granted ?? 0);
        await new Promise((r) => setTimeout(r, 20));
      }
      const reports = await workers.stop();
      const latencies: number[] = [];
      const outcomes: Record<string, number> = {};
      const wire = { roundTrips: 0, statements: 0, transactions: 0 };
      const trace = new Map<string, number>();
      for (const r of reports) {
        latencies.push(...(r.latencies ?? []));
        for (const [k, n] of Object.entries(r.outcomes ?? {})) outcomes[k] = (outcomes[k] ?? 0) + n;
        wire.roundTrips += r.wire?.roundTrips ?? 0;
        wire.statements += r.wire?.statements ?? 0;
        wire.transactions += r.wire?.transactions ?? 0;
        for (const [text, n] of Object.entries(r.trace ?? {}))
          trace.set(text, (trace.get(text) ?? 0) + n);
      }
      const { starts, runs, duplicates, notRun, window, windowSeconds } = tally(reports, jobs);
      const perTick = (n: number) => Math.round((n / windowSeconds) * 10) / 10;
      return {
        distribution,
        processes,
        jobsPerProcess: jobs,
        seconds,
        decisions: latencies.length,
        outcomes,
        p50Ms: Math.round(percentile(latencies, 50)),
        p99Ms: Math.round(percentile(latencies, 99)),
        perTick: {
          decisions: perTick(latencies.length),
          roundTrips: perTick(wire.roundTrips),
          statements: perTick(wire.statements),
          transactions: perTick(wire.transactions),
        },
        handlerStartP50Ms: Math.round(percentile(starts, 50)),
        handlerStartP99Ms: Math.round(percentile(starts, 99)),
        runs,
        duplicates,
        notRun,
        window,
        peakAdvisoryLocks: peak,
        peakGrantedAdvisoryLocks: peakGranted,
        ...(trace.size > 0
          ? {
              tracePerTick: Object.fromEntries(
                [...trace].sort((a, b) => b[1] - a[1]).map(([text, n]) => [text, perTick(n)]),
              ),
            }
          : {}),
      };
    },
  );
}

/** What the ceiling run measured. */
export interface CeilingReport {
  readonly processes: number;
  readonly seconds: number;
  readonly commitsPerSecond: number;
}

/**
 * `processes` workers committing the smallest transaction a run can be, as fast as they can, for
 * `seconds` (see ceiling-worker.ts).
 */
export async function measureCeiling(
  url: string,
  workerScript: string,
  processes: number,
  seconds: number,
): Promise<CeilingReport> {
  return withScratchSchema(
    url,
    'lockkit_ceiling',
    async (setup, schema) => {
      await setup.query(`CREATE SCHEMA "${schema}"`);
      await setup.query(`CREATE TABLE "${schema}".runs (owner text NOT NULL, n int8 NOT NULL)`);
    },
    async (_setup, schema) => {
      const workers = await spawnWorkers(processes, (i) => [
        workerScript,
        url,
        `"${schema}".runs`,
        `ceiling-${i}`,
      ]);
      await new Promise((r) => setTimeout(r, seconds * 1000));
      const reports = await workers.stop();
      let rate = 0;
      for (const r of reports) {
        const ms = (r.stoppedAt ?? 0) - (r.readyAt ?? 0);
        if (ms > 0) rate += ((r.commits ?? 0) * 1000) / ms;
      }
      return { processes, seconds, commitsPerSecond: Math.round(rate) };
    },
  );
}

/** What the claim model measured (see claim-model-worker.ts). */
export interface ClaimModelReport {
  readonly processes: number;
  readonly jobs: number;
  readonly seconds: number;
  /** Rows claimed and run per transaction. */
  readonly batch: number;
  /** `owned`: each process makes PENDING and claims only its own jobs' rows; `shared`: every job's. */
  readonly split: 'shared' | 'owned';
  /**
   * How a claimed row runs: in the claiming transaction between savepoints (`chained`: one round
   * trip between two runs), or in its own.
   */
  readonly run: ClaimRun;
  /** Claiming connections per process. */
  readonly connections: number;
  /** Whether a tick's rows were made PENDING half a second before it, rather than at it. */
  readonly ahead: boolean;
  /** Handler runs of the window's ticks, per second of ticks. */
  readonly runsPerSecond: number;
  readonly handlerStartP50Ms: number;
  readonly handlerStartP99Ms: number;
  readonly duplicates: number;
  readonly notRun: number;
  readonly windowTicks: number;
}

/** How the claim model runs a claimed row (see claim-model-worker.ts). */
export type ClaimRun = 'savepoint' | 'chained' | 'own';

/** The claim model's shape beyond its size (see claim-model-worker.ts). */
export interface ClaimModelShape {
  readonly batch: number;
  readonly split: 'shared' | 'owned';
  readonly run: ClaimRun;
  readonly connections: number;
  readonly ahead: boolean;
}

/**
 * `processes` workers of the claim model (see claim-model-worker.ts) on `jobs` per-second jobs for
 * `seconds`: the candidate design's database work alone, to hold it to the ceiling.
 */
export async function measureClaimModel(
  url: string,
  workerScript: string,
  processes: number,
  jobs: number,
  seconds: number,
  shape: ClaimModelShape,
): Promise<ClaimModelReport> {
  const { batch, split, run, connections, ahead } = shape;
  return withScratchSchema(
    url,
    'lockkit_claims',
    async (setup, schema) => {
      await setup.query(`CREATE SCHEMA "${schema}"`);
      await setup.query(
        `CREATE TABLE "${schema}".runs (job int4 NOT NULL, tick timestamptz NOT NULL,
           status text NOT NULL, owner text, PRIMARY KEY (job, tick))`,
      );
      await setup.query(`CREATE INDEX ON "${schema}".runs (tick) WHERE status = 'PENDING'`);
    },
    async (_setup, schema) => {
      const workers = await spawnWorkers(processes, (i) => [
        workerScript,
        url,
        `"${schema}".runs`,
        String(jobs),
        `claims-${i}`,
        String(batch),
        split === 'owned' ? `${i}/${processes}` : 'all',
        run,
        String(connections),
        ahead ? '1' : '0',
      ]);
      await new Promise((r) => setTimeout(r, seconds * 1000));
      const reports = await workers.stop();
      const t = tally(reports, jobs);
      return {
        processes,
        jobs,
        seconds,
        ...shape,
        runsPerSecond:
          t.window.ticks === 0 ? 0 : Math.round((t.runsInWindow * jobs) / t.window.ticks),
        handlerStartP50Ms: Math.round(percentile(t.starts, 50)),
        handlerStartP99Ms: Math.round(percentile(t.starts, 99)),
        duplicates: t.duplicates,
        notRun: t.notRun,
        windowTicks: t.window.ticks,
      };
    },
  );
}
