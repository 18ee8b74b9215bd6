/**
 * One memory probe, run as its own process by `memory.ts`: prints, as JSON, the resident set and
 * the live JavaScript memory (heap used + external) in MB of a
 * bare process (node-postgres loaded), of one holding a lock client over 16 open connections, or
 * of one whose scheduler has 10,000 jobs registered and started — all on one schedule
 * (`scheduler10k`), or each on a schedule of its own (`scheduler10kDistinct`): after a full GC,
 * with its peak resident set up to then (the kernel's high-water mark, which counts what
 * registering and starting touched even if a GC gave it back since), and again after 10 s of
 * idling (`settled`).
 *
 *   node --expose-gc memory-probe.mjs bare|pool16|scheduler10k|scheduler10kDistinct <database url>
 */
import { createScheduler } from '@lockkit/core';
import { createLockKit } from '@lockkit/pg';
import pg from 'pg';

/** Which process to measure. */
export type Probe = 'bare' | 'pool16' | 'scheduler10k' | 'scheduler10kDistinct';

/**
 * 10,000 distinct cron expressions, none of which fires for months: every second/minute pair of
 * an hour (3,600), on the first, second or third day of the month that is six months away.
 */
function distinctSchedules(now: Date): string[] {
  // Cron months count from 1: six months after this one, so no tick falls in the measurement.
  const month = ((now.getUTCMonth() + 6) % 12) + 1;
  return Array.from(
    { length: 10_000 },
    (_, j) => `${j % 60} ${Math.floor(j / 60) % 60} * ${1 + Math.floor(j / 3600)} ${month} *`,
  );
}

/** Memory in MB: resident set, and live JavaScript memory (heap used + external). */
interface Reading {
  readonly rssMb: number;
  readonly liveMb: number;
}

/** What a probe prints: its readings, and its peak resident set up to the first one. */
interface Readings extends Reading {
  /** The process's peak resident set (MB) up to and including the first reading. */
  readonly peakRssMb: number;
  readonly settled: Reading;
}

/** How long a probe idles before its settled reading: V8's memory reducer runs within it. */
const SETTLE_MS = 10_000;

/**
 * Memory after a full GC with the peak resident set up to then, and again after
 * {@link SETTLE_MS} of idling, GC'd again.
 */
async function readings(): Promise<Readings> {
  const read = async (): Promise<Reading> => {
    for (let i = 0; i < 3; i++) {
      (globalThis as { gc?: () => void }).gc?.();
      await new Promise((r) => setTimeout(r, 50));
    }
    const { rss, heapUsed, external } = process.memoryUsage();
    return { rssMb: rss / 2 ** 20, liveMb: (heapUsed + external) / 2 ** 20 };
  };
  const atOnce = await read();
  // The kernel's high-water mark so far: whatever registering, starting and a full GC made the
  // process touch, even what a GC gave back since. A container's memory limit must allow that;
  // the reading after a full GC can be well below it.
  const peakRssMb = process.resourceUsage().maxRSS / 1024;
  // A process that has just allocated a lot keeps its young generation grown until V8's memory
  // reducer sees it idle and shrinks it: what a long-running scheduler holds is after that.
  await new Promise((r) => setTimeout(r, SETTLE_MS));
  return { peakRssMb, ...atOnce, settled: await read() };
}

async function probe(kind: Probe, url: string): Promise<Readings> {
  if (kind === 'bare') return readings();
  // Idle connections stay open through the settling (pg closes them after 10 s by default).
  const pool = new pg.Pool({ connectionString: url, max: 16, idleTimeoutMillis: 0 });
  const locks = createLockKit(pool);
  if (kind === 'pool16') {
    // 16 connections open and each used for a decision, as a busy service has them.
    await Promise.all(
      Array.from({ length: 16 }, (_, i) =>
        locks.runExclusiveJob('memory', `job-${i}`, async () => {}),
      ),
    );
    const mb = await readings();
    await pool.end();
    return mb;
  }
  await locks.migrate();
  const scheduler = createScheduler(locks);
  // Registered, scheduled and waiting, none firing during the measurement: hourly jobs on one
  // shared schedule, or each on its own.
  const distinct = kind === 'scheduler10kDistinct' ? distinctSchedules(new Date()) : undefined;
  for (let j = 0; j < 10_000; j++) {
    const name = distinct ? `memory-distinct-${j}` : `memory-${j}`;
    scheduler.register(name, distinct?.[j] ?? '0 0 * * * *', () => {});
  }
  await scheduler.start();
  const mb = await readings();
  await scheduler.stop({ timeoutMs: 1000 });
  await pool.end();
  return mb;
}

const [kind, url] = process.argv.slice(2) as [Probe, string];
probe(kind, url).then(
  (mb) => process.stdout.write(`${JSON.stringify(mb)}\n`),
  (error: unknown) => {
    process.stderr.write(`${String(error)}\n`);
    process.exit(1);
  },
);
