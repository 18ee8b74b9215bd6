/**
 * The acceptance test: the same Nest application (test/app/tick-app.ts) started in three
 * processes against a real Postgres, clocks skewed up to ±400 ms, two per-second `@ExclusiveCron`
 * jobs for 12 s, the process running ahead SIGKILLed mid-run, the other two stopped by SIGTERM
 * through Nest's shutdown hooks. Every side effect is a row without a unique constraint; in the
 * judged window each (job, tick) must have exactly one: 0 duplicates, 0 missed.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { createLockKit } from '@lockkit/pg';
import { testDatabaseUrl } from '@lockkit/test-db';
import pg from 'pg';
import ts from 'typescript';
import { afterAll, beforeAll, expect, it } from 'vitest';

const SECONDS = 12;
const JOBS = ['invoices', 'reports'];
const SKEWS = [-400, 0, 400];
const schema = `lockkit_nest_mp_${randomBytes(4).toString('hex')}`;
const appSource = fileURLToPath(new URL('./app/tick-app.ts', import.meta.url));
// A name of its own per run, so that two runs in one checkout never read each other's half-written file.
const appOutput = fileURLToPath(new URL(`./app/dist/tick-app-${schema}.mjs`, import.meta.url));
let pool: pg.Pool;

beforeAll(async () => {
  // Node 20 runs no TypeScript: compile the app as Nest apps are, with TypeScript's legacy
  // decorators and their design-time metadata.
  const { outputText } = ts.transpileModule(readFileSync(appSource, 'utf8'), {
    compilerOptions: {
      module: ts.ModuleKind.ESNext,
      target: ts.ScriptTarget.ES2022,
      experimentalDecorators: true,
      emitDecoratorMetadata: true,
    },
    fileName: appSource,
  });
  mkdirSync(fileURLToPath(new URL('./app/dist/', import.meta.url)), { recursive: true });
  writeFileSync(appOutput, outputText);
  pool = new pg.Pool({ connectionString: testDatabaseUrl(), max: 2 });
  await createLockKit(pool, { schema }).migrate();
  await pool.query(`CREATE TABLE "${schema}".effects (job text, tick timestamptz, worker text)`);
});
afterAll(async () => {
  rmSync(appOutput, { force: true });
  await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
  await pool.end();
});

const running = (p: ChildProcess) => p.exitCode === null && p.signalCode === null;

/** Everything each app wrote to stdout. */
const outputs = new Map<ChildProcess, string>();

function ready(p: ChildProcess): Promise<void> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`app not ready: ${outputs.get(p)}`)), 20_000);
    p.stdout?.on('data', () => {
      const out = outputs.get(p) ?? '';
      if (out.includes('READY')) {
        clearTimeout(timer);
        resolve();
      } else if (out.includes('ERROR')) {
        clearTimeout(timer);
        reject(new Error(out));
      }
    });
  });
}

it(
  `3 Nest processes, 2 per-second @ExclusiveCron jobs for ${SECONDS} s, one SIGKILLed mid-run: 0 duplicates, 0 missed ticks`,
  async () => {
    const apps = SKEWS.map((skewMs, i) =>
      spawn(
        process.execPath,
        [appOutput, JSON.stringify({ url: testDatabaseUrl(), schema, worker: `w${i}`, skewMs })],
        { stdio: ['ignore', 'pipe', 'inherit'] },
      ),
    );
    const exits = apps.map(
      (p) =>
        new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
          p.once('exit', (code, signal) => resolve({ code, signal })),
        ),
    );
    for (const p of apps) {
      outputs.set(p, '');
      p.stdout?.on('data', (chunk: Buffer) => outputs.set(p, `${outputs.get(p)}${chunk}`));
    }
    try {
      await Promise.all(apps.map(ready));
      // Judge whole seconds that every app had started before, plus the largest skew.
      const windowStart = Math.ceil(Date.now() / 1000) * 1000 + 2000;
      await sleep(SECONDS * 500);
      // The app whose clock runs ahead fires first and claims most ticks: kill it mid-run.
      const victim = SKEWS.indexOf(Math.max(...SKEWS));
      apps[victim]?.kill('SIGKILL');
      await sleep(SECONDS * 500);
      const windowEnd = Math.floor(Date.now() / 1000) * 1000 - 2000;
      for (const p of apps) if (running(p)) p.kill('SIGTERM');
      const ended = await Promise.all(exits);
      // SIGTERM closes each app through Nest's shutdown hooks (the scheduler drains, then the
      // pool ends), after which Nest re-raises the signal.
      const stopped = apps.filter((_p, i) => i !== victim);
      expect(stopped.map((p) => outputs.get(p)?.split('\n').at(-2))).toEqual([
        'CLOSED SIGTERM',
        'CLOSED SIGTERM',
      ]);
      expect(ended.filter((_e, i) => i !== victim)).toEqual([
        { code: null, signal: 'SIGTERM' },
        { code: null, signal: 'SIGTERM' },
      ]);

      const due: number[] = [];
      for (let t = windowStart; t <= windowEnd; t += 1000) due.push(t);
      expect(due.length).toBeGreaterThanOrEqual(SECONDS - 5);
      const { rows } = await pool.query<{ job: string; tick: Date; n: number }>(
        `SELECT job, tick, count(*)::int AS n FROM "${schema}".effects
          WHERE tick BETWEEN $1 AND $2 GROUP BY job, tick`,
        [new Date(windowStart), new Date(windowEnd)],
      );
      for (const job of JOBS) {
        const runs = rows.filter((r) => r.job === job);
        expect(
          runs.filter((r) => r.n > 1).map((r) => r.tick.toISOString()),
          `${job}: duplicate runs`,
        ).toEqual([]);
        const ran = new Set(runs.map((r) => r.tick.getTime()));
        expect(
          due.filter((t) => !ran.has(t)).map((t) => new Date(t).toISOString()),
          `${job}: missed ticks`,
        ).toEqual([]);
      }
      // The killed app had been running ticks, and the others carried on after it died.
      const owners = await pool.query<{ worker: string; n: number }>(
        `SELECT worker, count(*)::int AS n FROM "${schema}".effects GROUP BY worker`,
      );
      const byWorker = new Map(owners.rows.map((r) => [r.worker, r.n]));
      expect(byWorker.get(`w${victim}`) ?? 0).toBeGreaterThan(0);
      expect(
        owners.rows.filter((r) => r.worker !== `w${victim}`).reduce((n, r) => n + r.n, 0),
      ).toBeGreaterThan(0);
    } finally {
      for (const p of apps) if (running(p)) p.kill('SIGKILL');
    }
  },
  SECONDS * 1000 + 40_000,
);
