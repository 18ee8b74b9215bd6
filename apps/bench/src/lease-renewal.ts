/**
 * Lease renewal latency under contention: one holder renews its lease every 10 ms while N
 * contenders — in a process of their own, so that their JavaScript does not crowd the holder's
 * event loop — hammer the same lease with claims (each loops `runWithLease` on it, no pause).
 *
 * A renewal is timed from the heartbeat handing its transaction to the executor to the end of
 * that transaction: the holder's client is a `@lockkit/pg` executor whose `transaction` is wrapped
 * with a timer, and during the task the heartbeat is its only caller (the claim goes by the
 * pipelined path). Next to it, on the same cadence and in the same process, a twin transaction
 * updates a row of its own through the same adapter: what the machine alone does to such a
 * transaction. The renewal tracking the twin means contenders cost it nothing beyond the CPU
 * they take; a renewal queued behind their locks would leave the twin behind. An observer also
 * samples the holder's connections waiting on a lock. Rounds alternate between the contender
 * counts so that drift on the machine hits them alike.
 */
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { createLockClient, isLockkitError } from '@lockkit/core';
import { pgExecutor } from '@lockkit/pg';
import pg from 'pg';
import { percentile } from './measure.js';

/** What one contender count measured, all rounds together. */
export interface RenewalLatency {
  readonly contenders: number;
  readonly renewals: number;
  readonly p50Ms: number;
  readonly p99Ms: number;
  readonly maxMs: number;
  /** The twin transaction (same adapter, same cadence, an uncontended row) at the same time. */
  readonly twinP50Ms: number;
  readonly twinP99Ms: number;
  /** Claims the contenders made per second, every one refused. */
  readonly claimsPerSecond: number;
  /** Samples (about every 5 ms) that found one of the holder's connections waiting on a lock. */
  readonly lockWaitSamples: number;
  /** Whether the holder ever lost its lease (it must not). */
  readonly lost: boolean;
}

/** What one contender count collects over its rounds. */
interface Samples {
  readonly renewals: number[];
  readonly twin: number[];
  claims: number;
  lockWaits: number;
  lost: boolean;
}

/** The lease the holder keeps: renewals every 10 ms for many samples, a TTL far above them. */
const LEASE = { ttlMs: 5000, renewEveryMs: 10, safetyMarginMs: 1000 } as const;

/** Runs the contender process for `ms` once `start()` is called; resolves with its claim counts. */
async function contenders(
  script: string,
  args: readonly string[],
): Promise<{ start(): void; done: Promise<{ claims: number; executed: number }> }> {
  const child = spawn(process.execPath, [script, ...args], {
    stdio: ['pipe', 'pipe', 'inherit'],
  });
  let out = '';
  const ready = new Promise<void>((resolve, reject) => {
    child.stdout.on('data', (chunk: Buffer) => {
      out += chunk.toString();
      if (out.includes('READY\n')) resolve();
    });
    child.once('exit', (code) => reject(new Error(`contenders exited early (${code})`)));
  });
  await ready;
  const done = new Promise<{ claims: number; executed: number }>((resolve, reject) => {
    child.once('exit', (code) => {
      const last = out.trim().split('\n').at(-1) ?? '';
      if (code === 0) resolve(JSON.parse(last) as { claims: number; executed: number });
      else reject(new Error(`contenders failed (${code}): ${out}`));
    });
  });
  return { start: () => child.stdin.end('go\n'), done };
}

/** Measures renewal latency with each of `contenderCounts`, `rounds` × `ms` per count. */
export async function measureRenewalLatency(
  url: string,
  contenderScript: string,
  contenderCounts: readonly number[],
  ms: number,
  rounds: number,
): Promise<RenewalLatency[]> {
  const schema = `lockkit_bench_${randomBytes(4).toString('hex')}`;
  const namespace = 'bench-lease';
  const tag = `lockkit-bench-holder-${randomBytes(4).toString('hex')}`;
  const tagged = new URL(url);
  tagged.searchParams.set('application_name', tag);
  const holderPool = new pg.Pool({ connectionString: tagged.toString(), max: 2 });
  const twinPool = new pg.Pool({ connectionString: url, max: 1 });
  const observer = new pg.Client({ connectionString: url });
  for (const p of [holderPool, twinPool]) p.on('error', () => {});
  await observer.connect();
  const results = new Map<number, Samples>(
    contenderCounts.map((n) => [
      n,
      { renewals: [], twin: [], claims: 0, lockWaits: 0, lost: false },
    ]),
  );
  let current: Samples | undefined;
  const plain = pgExecutor(holderPool);
  const timed: typeof plain = {
    ...plain,
    transaction: async (fn) => {
      const started = performance.now();
      try {
        return await plain.transaction(fn);
      } finally {
        current?.renewals.push(performance.now() - started);
      }
    },
  };
  const holder = createLockClient(timed, { schema });
  const twin = pgExecutor(twinPool);
  try {
    await holder.migrate();
    await observer.query(`CREATE TABLE "${schema}".twin (n int NOT NULL)`);
    await observer.query(`INSERT INTO "${schema}".twin VALUES (0)`);
    for (let round = 0; round < rounds; round++) {
      for (const count of contenderCounts) {
        const jobKey = `renewal-${round}-${count}`;
        const result = results.get(count) as Samples;
        const rivals =
          count > 0
            ? await contenders(contenderScript, [
                url,
                schema,
                namespace,
                jobKey,
                String(count),
                String(ms),
              ])
            : undefined;
        const run = holder.runWithLease(
          namespace,
          jobKey,
          async (lease) => {
            let recording = true;
            current = result;
            rivals?.start();
            const twinLoop = (async () => {
              while (recording) {
                const started = performance.now();
                await twin.transaction(({ query }) =>
                  query(`UPDATE "${schema}".twin SET n = n + 1`),
                );
                if (recording) result.twin.push(performance.now() - started);
                await new Promise((resolve) => setTimeout(resolve, LEASE.renewEveryMs));
              }
            })();
            const sampler = (async () => {
              while (recording) {
                const { rows } = await observer.query<{ waiting: string }>(
                  `SELECT count(*)::text AS waiting FROM pg_stat_activity
                    WHERE application_name = $1 AND wait_event_type = 'Lock'`,
                  [tag],
                );
                if (Number(rows[0]?.waiting) > 0) result.lockWaits++;
                await new Promise((resolve) => setTimeout(resolve, 5));
              }
            })();
            await new Promise((resolve) => setTimeout(resolve, ms));
            recording = false;
            current = undefined;
            await Promise.all([twinLoop, sampler]);
            return lease.signal.aborted;
          },
          LEASE,
        );
        try {
          const r = await run;
          if (!r.executed || r.result) result.lost = true;
        } catch (error) {
          if (!isLockkitError(error) || error.code !== 'LEASE_LOST') throw error;
          result.lost = true;
        }
        if (rivals) {
          const { claims, executed } = await rivals.done;
          if (executed > 0) throw new Error('a contender claimed a held lease');
          result.claims += claims / (ms / 1000);
        }
      }
    }
  } finally {
    await observer.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`).catch(() => {});
    await observer.end();
    await holderPool.end();
    await twinPool.end();
  }
  const round2 = (n: number) => Number(n.toFixed(2));
  return contenderCounts.map((count) => {
    const r = results.get(count) as Samples;
    return {
      contenders: count,
      renewals: r.renewals.length,
      p50Ms: round2(percentile(r.renewals, 50)),
      p99Ms: round2(percentile(r.renewals, 99)),
      maxMs: round2(Math.max(...r.renewals)),
      twinP50Ms: round2(percentile(r.twin, 50)),
      twinP99Ms: round2(percentile(r.twin, 99)),
      claimsPerSecond: Math.round(r.claims / rounds),
      lockWaitSamples: r.lockWaits,
      lost: r.lost,
    };
  });
}
