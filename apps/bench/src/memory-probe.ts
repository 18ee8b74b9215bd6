/**
 * One memory probe, run as its own process by `memory.ts`: prints, as JSON, the resident set and
 * the live JavaScript memory (heap used + external) in MB of a
 * bare process (node-postgres loaded), of one holding a lock client over 16 open connections, or
 * of one whose scheduler has 10,000 jobs registered and started — after a full GC.
 *
 *   node --expose-gc memory-probe.mjs bare|pool16|scheduler10k <database url>
 */
import { createScheduler } from '@lockkit/core';
import { createLockKit } from '@lockkit/pg';
import pg from 'pg';

/** Which process to measure. */
export type Probe = 'bare' | 'pool16' | 'scheduler10k';

async function probe(kind: Probe, url: string): Promise<{ rssMb: number; liveMb: number }> {
  const settle = async () => {
    for (let i = 0; i < 3; i++) {
      (globalThis as { gc?: () => void }).gc?.();
      await new Promise((r) => setTimeout(r, 50));
    }
    const { rss, heapUsed, external } = process.memoryUsage();
    return { rssMb: rss / 2 ** 20, liveMb: (heapUsed + external) / 2 ** 20 };
  };
  if (kind === 'bare') return settle();
  const pool = new pg.Pool({ connectionString: url, max: 16 });
  const locks = createLockKit(pool);
  if (kind === 'pool16') {
    // 16 connections open and each used for a decision, as a busy service has them.
    await Promise.all(
      Array.from({ length: 16 }, (_, i) =>
        locks.runExclusiveJob('memory', `job-${i}`, async () => {}),
      ),
    );
    const mb = await settle();
    await pool.end();
    return mb;
  }
  await locks.migrate();
  const scheduler = createScheduler(locks);
  // Hourly jobs: registered, scheduled and waiting, none firing during the measurement.
  for (let j = 0; j < 10_000; j++) scheduler.register(`memory-${j}`, '0 0 * * * *', () => {});
  await scheduler.start();
  const mb = await settle();
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
