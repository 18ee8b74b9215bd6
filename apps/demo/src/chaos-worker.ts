/**
 * One worker process of the chaos run (`pnpm chaos`). Through its own faulty network path (the
 * parent's proxy), it runs the chaos jobs on the scheduler — each run records one execution row
 * inside its transaction — and contends for one long lease in a loop, writing fenced rows under
 * each token. It reports what it does to the parent as JSON lines on stdout, and takes clock-skew
 * changes from the parent over IPC. It may be killed, stopped and resumed at any moment.
 */
import {
  createScheduler,
  isLockkitError,
  type LockClient,
  SCHEDULER_OUTCOMES,
} from '@lockkit/core';
import { type AdapterName, connect } from './adapters.js';
import { CHAOS_LEASE, chaosJobName } from './chaos-plan.js';

interface ChaosWorkerConfig {
  readonly adapter: AdapterName;
  readonly url: string;
  readonly schema: string;
  readonly worker: string;
  readonly skewMs: number;
  readonly jobs: number;
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
          say({ type: 'lease-claimed', token: String(lease.token), tookOver: lease.tookOver });
          for (let step = 0; step < CHAOS_LEASE.steps; step++) {
            await sleep(CHAOS_LEASE.stepMs);
            // No local check of lease.signal first, on purpose: a holder resumed after a stall
            // must be stopped by the fence in the database, and the run counts those refusals.
            try {
              await lease.fenced((_tx, query) =>
                query(write, [String(lease.token), config.worker]),
              );
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
  });
  const record = `INSERT INTO "${config.schema}".executions (job, tick, worker) VALUES ($1, $2, $3)`;
  for (let j = 0; j < config.jobs; j++) {
    const name = chaosJobName(j);
    scheduler.register(
      name,
      '* * * * * *',
      async (run) => {
        if (run.mode !== 'transaction') return;
        await sleep(20 + ((j * 37) % 100)); // a short job: 20–120 ms
        await run.query(record, [name, run.tick.toISOString(), config.worker]);
      },
      // Ticks a fault kept everyone from running are run late, once, rather than lost.
      { catchUp: { withinMs: 120_000 } },
    );
  }
  for (const type of [...SCHEDULER_OUTCOMES, 'error'] as const) {
    scheduler.on(type, (event) => {
      const tick = 'tick' in event ? event.tick.getTime() : undefined;
      say({ type, job: event.job, tick, ...('error' in event && { error: String(event.error) }) });
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
