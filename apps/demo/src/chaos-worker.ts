/**
 * One worker process of the chaos run (`pnpm chaos`). Through its own faulty network path (the
 * parent's proxy), it runs the chaos jobs on the scheduler — each run records one execution row
 * inside its transaction — and contends for one long lease in a loop, writing fenced rows under
 * each token. It reports what it does to the parent as JSON lines on stdout, and takes clock-skew
 * changes from the parent over IPC. It may be killed, stopped and resumed at any moment.
 *
 * For the failover run (`pnpm chaos --failover`) it also runs per-second jobs in lease mode (each
 * run's execution row is a fenced write), reports every fencing token it is granted, and checks
 * inside every run that the server it writes to is not a standby in recovery.
 */
import { randomUUID } from 'node:crypto';
import { inspect } from 'node:util';
import {
  createScheduler,
  isLockkitError,
  type LockClient,
  type QueryFn,
  SCHEDULER_NAMESPACE,
  SCHEDULER_OUTCOMES,
} from '@lockkit/core';
import { type AdapterName, connect } from './adapters.js';
import { CHAOS_LEASE, CHAOS_LEASE_JOB, chaosJobName, chaosLeaseJobName } from './chaos-plan.js';

interface ChaosWorkerConfig {
  readonly adapter: AdapterName;
  readonly url: string;
  readonly schema: string;
  readonly worker: string;
  readonly skewMs: number;
  readonly jobs: number;
  /** Lease-mode per-second jobs (the failover run's); default none. */
  readonly leaseJobs?: number;
  /** The scheduler's `distribution`; default every-instance. */
  readonly distribution?: 'every-instance' | 'owned';
}

const say = (message: Record<string, unknown>) =>
  process.stdout.write(`${JSON.stringify({ ...message, at: Date.now() })}\n`);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Contends for the chaos lease until stopped; each holder writes fenced rows under its token. */
async function leaseLoop(
  locks: LockClient<unknown, unknown>,
  config: ChaosWorkerConfig,
  stopped: () => boolean,
): Promise<void> {
  const write = `INSERT INTO "${config.schema}".lease_writes (token, worker) VALUES ($1, $2)`;
  while (!stopped()) {
    try {
      await locks.runWithLease(
        CHAOS_LEASE.namespace,
        CHAOS_LEASE.jobKey,
        async (lease) => {
          say({
            type: 'lease-claimed',
            lease: `${CHAOS_LEASE.namespace}/${CHAOS_LEASE.jobKey}`,
            token: String(lease.token),
            tookOver: lease.tookOver,
          });
          for (let step = 0; step < CHAOS_LEASE.steps; step++) {
            await sleep(CHAOS_LEASE.stepMs);
            // No local check of lease.signal first, on purpose: a holder resumed after a stall
            // must be stopped by the fence in the database, and the run counts those refusals.
            try {
              await lease.fenced(async (_tx, query) => {
                await notOnStandby(query);
                await query(write, [String(lease.token), config.worker]);
              });
            } catch (error) {
              if (isLockkitError(error) && error.code === 'LEASE_LOST') {
                say({ type: 'stale-write-refused', token: String(lease.token) });
              }
              throw error;
            }
          }
        },
        { ttlMs: CHAOS_LEASE.ttlMs, owner: config.worker },
      );
    } catch (error) {
      say({ type: 'lease-ended', error: String(error) });
    }
    await sleep(100);
  }
}

/**
 * Reports a run that found itself on a server in recovery (a standby): none may, since a standby
 * takes no writes and the run's claim is a write.
 */
async function notOnStandby(query: QueryFn): Promise<void> {
  const rows = await query('SELECT pg_is_in_recovery() AS recovery');
  if (rows[0]?.recovery === true) say({ type: 'ran-on-standby' });
}

async function main(): Promise<void> {
  const config = JSON.parse(process.argv[2] ?? '{}') as ChaosWorkerConfig;
  let skewMs = config.skewMs;
  process.on('message', (message: { type?: string; skewMs?: number }) => {
    if (message.type === 'skew' && typeof message.skewMs === 'number') skewMs = message.skewMs;
  });
  const { locks, close } = connect(config.adapter, config.url, config.schema, 30);
  const scheduler = createScheduler(locks, {
    owner: config.worker,
    now: () => Date.now() + skewMs,
    catchUpGraceMs: 3000,
    distribution: config.distribution ?? 'every-instance',
  });
  const record = `INSERT INTO "${config.schema}".executions (job, tick, worker, run_id) VALUES ($1, $2, $3, $4)`;
  // Each attempt's own id, written with its execution row and reported with its 'ran' event: a
  // run a worker saw committed can then be looked for in the survivor of a failover.
  const runIds = new Map<string, string>();
  const runId = (job: string, tick: Date) => {
    const id = randomUUID();
    runIds.set(`${job}@${tick.getTime()}`, id);
    return id;
  };
  for (let j = 0; j < config.jobs; j++) {
    const name = chaosJobName(j);
    scheduler.register(
      name,
      '* * * * * *',
      async (run) => {
        if (run.mode !== 'transaction') return;
        await sleep(20 + ((j * 37) % 100)); // a short job: 20–120 ms
        await notOnStandby(run.query);
        await run.query(record, [
          name,
          run.tick.toISOString(),
          config.worker,
          runId(name, run.tick),
        ]);
      },
      // Ticks a fault kept everyone from running are run late, once, rather than lost.
      { catchUp: { withinMs: 120_000 } },
    );
  }
  for (let j = 0; j < (config.leaseJobs ?? 0); j++) {
    const name = chaosLeaseJobName(j);
    scheduler.register(
      name,
      '* * * * * *',
      async (run) => {
        say({
          type: 'job-lease-claimed',
          lease: `${SCHEDULER_NAMESPACE}/${name}`,
          token: String(run.lease.token),
          job: name,
          tick: run.tick.getTime(),
        });
        await sleep(CHAOS_LEASE_JOB.workMs);
        const id = runId(name, run.tick);
        await run.lease.fenced(async (_tx, query) => {
          await notOnStandby(query);
          await query(record, [name, run.tick.toISOString(), config.worker, id]);
        });
      },
      { mode: 'lease', lease: { ttlMs: CHAOS_LEASE_JOB.ttlMs }, catchUp: { withinMs: 120_000 } },
    );
  }
  for (const type of [...SCHEDULER_OUTCOMES, 'error'] as const) {
    scheduler.on(type, (event) => {
      const tick = 'tick' in event ? event.tick.getTime() : undefined;
      const id = type === 'ran' ? runIds.get(`${event.job}@${tick}`) : undefined;
      say({
        type,
        job: event.job,
        tick,
        ...(id && { runId: id }),
        ...('error' in event && { error: String(event.error) }),
      });
    });
  }
  await scheduler.start();
  let stopping = false;
  const leases = leaseLoop(locks, config, () => stopping);
  say({ type: 'ready' });
  process.once('SIGTERM', () => {
    stopping = true;
    void (async () => {
      await scheduler.stop({ timeoutMs: 5000 });
      await leases;
      await close();
      process.exit(0);
    })();
  });
}

main().catch((error: unknown) => {
  say({ type: 'fatal', error: String(error) });
  process.exit(1);
});
// A rejection nobody handled would end the process with only the error's stack, which for a
// driver's socket error names no query: say which promise it was (a postgres.js query has its text).
// An exception nobody caught (a driver's timer, say) ends the process too: a crash the verdict
// must count, not a worker that merely went quiet.
process.on('uncaughtException', (error: unknown) => {
  say({ type: 'fatal', error: `uncaught exception: ${inspect(error, { depth: 4 })}` });
  process.exit(1);
});
process.on('unhandledRejection', (error: unknown, promise: Promise<unknown>) => {
  const p = promise as Promise<unknown> & { strings?: unknown };
  const what = `${p.constructor?.name ?? 'Promise'}${p.strings === undefined ? '' : ` ${JSON.stringify(p.strings)}`}`;
  say({ type: 'fatal', error: `unhandled rejection of ${what}: ${inspect(error, { depth: 4 })}` });
  process.exit(1);
});
