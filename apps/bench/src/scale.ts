/**
 * Scale: several processes × many per-second jobs on one server, for some seconds. Reports the
 * p50/p99 decision latency per tick (scheduled tick → outcome, on every process) and the peak
 * number of advisory locks in `pg_locks` — which must follow the jobs running at that moment,
 * never the jobs registered.
 */
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { createLockKit } from '@lockkit/pg';
import pg from 'pg';
import { percentile } from './measure.js';

/** What one scale run measured. */
export interface ScaleReport {
  readonly processes: number;
  readonly jobsPerProcess: number;
  readonly seconds: number;
  readonly decisions: number;
  readonly outcomes: Record<string, number>;
  readonly p50Ms: number;
  readonly p99Ms: number;
  readonly peakAdvisoryLocks: number;
  readonly peakGrantedAdvisoryLocks: number;
}

/** Runs `processes` workers of `jobs` per-second jobs each for `seconds` against `url`. */
export async function measureScale(
  url: string,
  workerScript: string,
  processes: number,
  jobs: number,
  seconds: number,
): Promise<ScaleReport> {
  const schema = `lockkit_scale_${randomBytes(4).toString('hex')}`;
  const setup = new pg.Pool({ connectionString: url, max: 2 });
  await createLockKit(setup, { schema }).migrate();
  const children = Array.from({ length: processes }, (_, i) =>
    spawn(process.execPath, [workerScript, url, schema, String(jobs), `p${i}`], {
      stdio: ['ignore', 'pipe', 'inherit'],
    }),
  );
  const outputs = children.map((child) => {
    let text = '';
    child.stdout?.on('data', (chunk: Buffer) => {
      text += chunk.toString();
    });
    return () => text;
  });
  const readyBy = Date.now() + 60_000;
  while (!outputs.every((o) => o().includes('"ready"'))) {
    if (Date.now() > readyBy) throw new Error('scale workers did not start');
    await new Promise((r) => setTimeout(r, 50));
  }
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
  const exited = children.map((child) => new Promise((r) => child.once('exit', r)));
  for (const child of children) child.kill('SIGTERM');
  await Promise.all(exited);
  const latencies: number[] = [];
  const outcomes: Record<string, number> = {};
  for (const output of outputs) {
    const last = output().trim().split('\n').at(-1) ?? '{}';
    const r = JSON.parse(last) as { latencies?: number[]; outcomes?: Record<string, number> };
    latencies.push(...(r.latencies ?? []));
    for (const [k, n] of Object.entries(r.outcomes ?? {})) outcomes[k] = (outcomes[k] ?? 0) + n;
  }
  await setup.query(`DROP SCHEMA "${schema}" CASCADE`);
  await setup.end();
  return {
    processes,
    jobsPerProcess: jobs,
    seconds,
    decisions: latencies.length,
    outcomes,
    p50Ms: Math.round(percentile(latencies, 50)),
    p99Ms: Math.round(percentile(latencies, 99)),
    peakAdvisoryLocks: peak,
    peakGrantedAdvisoryLocks: peakGranted,
  };
}
