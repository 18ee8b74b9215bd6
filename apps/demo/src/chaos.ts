/**
 * `pnpm chaos`: worker processes run per-second jobs and contend for a lease on a PostgreSQL of
 * their own, while a seeded fault injector kills, stops and resumes workers, terminates lock
 * holders' backends, restarts the server, drops and stalls the network between each worker and the
 * server, and skews clocks. Then the run is judged from the database and from what an outside
 * observer saw; the last line of `--json` is the verdict.
 *
 *   pnpm chaos [--ticks 600] [--jobs 10] [--workers 4] [--seed N] [--adapter pg] [--json] [--dump FILE]
 *
 * `pnpm chaos --failover` runs the failover mode instead (failover.ts).
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { randomInt } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { LockKey, SCHEDULER_NAMESPACE } from '@lockkit/core';
import { startEmbeddedPostgres } from '@lockkit/test-db/embedded';
import pg from 'pg';
import { ADAPTERS, type AdapterName, connect } from './adapters.js';
import {
  CHAOS_LEASE,
  chaosJobName,
  FAULT_KINDS,
  type FaultKind,
  type PlannedFault,
  planFaults,
} from './chaos-plan.js';
import { createChaosTables, untilDecided } from './chaos-tables.js';
import { invariantsHeld } from './chaos-verdict.js';
import { failoverCommand } from './failover.js';
import { type FaultProxy, startFaultProxy } from './fault-proxy.js';
import { onJsonLines } from './json-lines.js';
import { adapterOption, integerOption } from './options.js';

const USAGE = `Usage: pnpm chaos [options]
  --ticks N        judged ticks to run, summed over the jobs (default 600)
  --jobs N         per-second jobs every worker registers (default 10)
  --workers N      worker processes (default 4)
  --seed N         the fault schedule's seed (default: random; printed, to replay a run)
  --adapter NAME   ${ADAPTERS.join(' | ')} (default pg)
  --distribution D every-instance | owned: which workers decide each tick (the scheduler's
                   option; default every-instance)
  --json           print only the verdict, as one JSON object on the last line
  --dump FILE      write every worker event, every fault applied and the ledger's rows to FILE
                   (JSON), to find out why a verdict failed
  --failover       a primary/standby failover instead (--failover --help for its options)
`;

const SCHEMA = 'lockkit_chaos';
const WARM_UP_MS = 5000;
const TAIL_MS = 10_000;
/** Longest wait after the run for catch-up to decide the last judged ticks. */
const DRAIN_LIMIT_MS = 60_000;

interface Options {
  ticks: number;
  jobs: number;
  workers: number;
  seed: number;
  adapter: AdapterName;
  /** The workers' scheduler `distribution`. */
  distribution: 'every-instance' | 'owned';
  json: boolean;
  /** Where to write the run's events and ledger rows (`--dump`), if anywhere. */
  dump: string | undefined;
}

function options(): Options {
  const { values } = parseArgs({
    options: {
      ticks: { type: 'string', default: '600' },
      jobs: { type: 'string', default: '10' },
      workers: { type: 'string', default: '4' },
      seed: { type: 'string' },
      adapter: { type: 'string', default: 'pg' },
      distribution: { type: 'string', default: 'every-instance' },
      json: { type: 'boolean', default: false },
      dump: { type: 'string' },
      help: { type: 'boolean', short: 'h', default: false },
    },
  });
  if (values.help) {
    process.stdout.write(USAGE);
    process.exit(0);
  }
  const int = integerOption;
  const adapter = adapterOption(values.adapter);
  const distribution = values.distribution;
  if (distribution !== 'every-instance' && distribution !== 'owned') {
    process.stderr.write(`--distribution must be every-instance or owned, not '${distribution}'\n`);
    process.exit(2);
  }
  return {
    ticks: int('ticks', values.ticks, 10, 1_000_000),
    jobs: int('jobs', values.jobs, 1, 50),
    workers: int('workers', values.workers, 2, 16),
    seed: values.seed === undefined ? randomInt(2 ** 31) : int('seed', values.seed, 0, 2 ** 32 - 1),
    adapter,
    distribution,
    json: values.json,
    dump: values.dump,
  };
}

interface Slot {
  readonly index: number;
  readonly proxy: FaultProxy;
  generation: number;
  process?: ChildProcess;
  alive: boolean;
  stopped: boolean;
  skewMs: number;
}

/** A worker's JSON line. */
interface WorkerMessage {
  readonly type: string;
  readonly at: number;
  readonly token?: string;
  readonly job?: string;
  readonly tick?: number;
  readonly error?: string;
}

/** A fault as applied, with what it hit. */
interface AppliedFault {
  readonly kind: FaultKind;
  readonly at: number;
  readonly slot: number;
  /**
   * The worker that held the lease when a fault took it out — killed, or stopped or cut off for
   * longer than the lease TTL — if one did: the next claim by another worker is a takeover.
   */
  readonly leaseVictim: string | undefined;
  /** Chaos jobs whose transaction lock the fault cut (terminate, kill). */
  readonly jobs: readonly string[];
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function main(): Promise<void> {
  if (process.argv.slice(2).includes('--failover')) {
    await failoverCommand();
    return;
  }
  let o: Options;
  try {
    o = options();
  } catch (error) {
    process.stderr.write(`pnpm chaos: ${(error as Error).message}\n${USAGE}`);
    process.exit(2);
  }
  const log = (line: string) => {
    if (!o.json) process.stdout.write(`${line}\n`);
  };
  const judgedSeconds = Math.ceil(o.ticks / o.jobs);
  const durationMs = WARM_UP_MS + judgedSeconds * 1000 + TAIL_MS;
  const plan = planFaults(o.seed, durationMs, o.workers);
  log(
    `chaos: seed ${o.seed}, @lockkit/${o.adapter}, ${o.workers} workers (${o.distribution}), ${o.jobs} per-second jobs, ${Math.round(durationMs / 1000)} s, ${plan.length} faults planned`,
  );

  // A server of our own, durable across crashes like a production one: we restart it.
  const server = await startEmbeddedPostgres({ durable: true });
  const slots: Slot[] = [];
  const cleanups: (() => Promise<unknown>)[] = [];
  const cleanup = async () => {
    for (const c of cleanups.splice(0).reverse()) await c().catch(() => {});
  };
  cleanups.push(() => server.stop());
  process.once('SIGINT', () => {
    void cleanup().then(() => process.exit(130));
  });
  try {
    const verdict = await run(o, server, slots, plan, durationMs, judgedSeconds, cleanups, log);
    await cleanup();
    if (o.json) process.stdout.write(`${JSON.stringify(verdict)}\n`);
    if (!verdict.ok) {
      process.stderr.write(
        `chaos: invariants violated. Replay: pnpm chaos --seed ${o.seed} --ticks ${o.ticks} --jobs ${o.jobs} --workers ${o.workers} --adapter ${o.adapter} --distribution ${o.distribution}\n`,
      );
      process.exitCode = 1;
    }
  } catch (error) {
    await cleanup();
    throw error;
  }
}

async function run(
  o: Options,
  server: Awaited<ReturnType<typeof startEmbeddedPostgres>>,
  slots: Slot[],
  plan: readonly PlannedFault[],
  durationMs: number,
  judgedSeconds: number,
  cleanups: (() => Promise<unknown>)[],
  log: (line: string) => void,
) {
  const setup = connect(o.adapter, server.url, SCHEMA);
  await setup.locks.migrate();
  await setup.close();
  const admin = () => {
    const client = new pg.Client({ connectionString: server.url, application_name: 'chaos-judge' });
    client.on('error', () => {});
    return client;
  };
  {
    const client = admin();
    await client.connect();
    await createChaosTables(client, SCHEMA);
    await client.end();
  }

  // Which lock is which: every chaos job's scheduler key, and the lease's.
  const coordinates = (key: LockKey) =>
    `${key.pgLocks.classid}/${key.pgLocks.objid}/${key.pgLocks.objsubid}`;
  const jobOfKey = new Map<string, string>();
  for (let j = 0; j < o.jobs; j++) {
    jobOfKey.set(
      coordinates(LockKey.fromNames(SCHEDULER_NAMESPACE, chaosJobName(j))),
      chaosJobName(j),
    );
  }
  jobOfKey.set(coordinates(LockKey.fromNames(CHAOS_LEASE.namespace, CHAOS_LEASE.jobKey)), 'lease');

  // The outside observer: samples pg_locks for two granted exclusive holders of one key.
  let exclusivityViolations = 0;
  let samples = 0;
  let observing = true;
  const observer = (async () => {
    let client: pg.Client | undefined;
    while (observing) {
      try {
        if (!client) {
          client = admin();
          await client.connect();
        }
        const { rows } = await client.query<{ n: number }>(
          `SELECT count(*)::int AS n FROM (
             SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted AND mode = 'ExclusiveLock'
             GROUP BY database, classid, objid, objsubid HAVING count(*) > 1) twice`,
        );
        samples++;
        exclusivityViolations += rows[0]?.n ?? 0;
      } catch {
        await client?.end().catch(() => {});
        client = undefined;
      }
      await sleep(100);
    }
    await client?.end().catch(() => {});
  })();
  cleanups.push(async () => {
    observing = false;
    await observer;
  });

  // Workers, each behind its own fault proxy.
  const messages: (WorkerMessage & { worker: string })[] = [];
  let leaseHolder: string | undefined;
  const workerFile = fileURLToPath(new URL('./chaos-worker.mjs', import.meta.url));
  const spawnWorker = (slot: Slot) => {
    slot.generation++;
    const name = `w${slot.index}.${slot.generation}`;
    const url = new URL(slot.proxy.url);
    url.searchParams.set('application_name', `chaos-w${slot.index}`);
    const child = spawn(
      process.execPath,
      [
        workerFile,
        JSON.stringify({
          adapter: o.adapter,
          url: url.toString(),
          schema: SCHEMA,
          worker: name,
          skewMs: slot.skewMs,
          jobs: o.jobs,
          distribution: o.distribution,
        }),
      ],
      { stdio: ['ignore', 'pipe', 'inherit', 'ipc'] },
    );
    slot.process = child;
    slot.alive = true;
    slot.stopped = false;
    child.once('exit', () => {
      if (slot.process === child) slot.alive = false;
    });
    onJsonLines<WorkerMessage>(child.stdout, (message) => {
      messages.push({ ...message, worker: name });
      if (message.type === 'lease-claimed') leaseHolder = name;
      if (message.type === 'lease-ended' && leaseHolder === name) leaseHolder = undefined;
      if (message.type === 'fatal') process.stderr.write(`${name}: ${message.error}\n`);
    });
  };
  for (let i = 0; i < o.workers; i++) {
    const proxy = await startFaultProxy(server.url);
    cleanups.push(() => proxy.close());
    const skewMs = Math.round(-800 + (1600 * i) / (o.workers - 1));
    const slot: Slot = { index: i, proxy, generation: 0, alive: false, stopped: false, skewMs };
    slots.push(slot);
    spawnWorker(slot);
  }
  cleanups.push(async () => {
    for (const slot of slots) {
      if (!slot.alive || !slot.process) continue;
      const exited = new Promise((r) => slot.process?.once('exit', r));
      slot.process.kill('SIGKILL');
      await exited;
    }
  });
  const readyBy = Date.now() + 30_000;
  while (
    !slots.every((s) => messages.some((m) => m.type === 'ready' && m.worker === `w${s.index}.1`))
  ) {
    if (Date.now() > readyBy || slots.some((s) => !s.alive))
      throw new Error('a worker failed to start');
    await sleep(50);
  }
  const started = Date.now();
  log(`workers ready; judging ticks from +${WARM_UP_MS / 1000} s for ${judgedSeconds} s`);

  // The faults, on schedule.
  const applied: AppliedFault[] = [];
  const downtime: [number, number][] = [];
  const pending: Promise<unknown>[] = [];
  const lockedJobs = async (where: string, params: unknown[]) => {
    const client = admin();
    try {
      await client.connect();
      const { rows } = await client.query<{
        pid: number;
        classid: string;
        objid: string;
        objsubid: string;
      }>(
        `SELECT l.pid, l.classid::text AS classid, l.objid::text AS objid, l.objsubid::text AS objsubid
           FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
          WHERE l.locktype = 'advisory' AND l.granted AND ${where}`,
        params,
      );
      return rows.map((r) => ({
        pid: r.pid,
        job: jobOfKey.get(`${r.classid}/${r.objid}/${r.objsubid}`),
      }));
    } catch {
      return [];
    } finally {
      await client.end().catch(() => {});
    }
  };
  for (const fault of plan) {
    const wait = started + fault.atMs - Date.now();
    if (wait > 0) await sleep(wait);
    // The planned slot, or the next one the fault can hit (alive, and not already stopped).
    const eligible = (s: Slot) => s.alive && !s.stopped;
    const slot =
      [...slots.slice(fault.slot), ...slots.slice(0, fault.slot)].find(eligible) ??
      (slots[fault.slot] as Slot);
    const workerName = `w${slot.index}.${slot.generation}`;
    const takesHolderOut =
      fault.kind === 'kill' ||
      ((fault.kind === 'stop' || fault.kind === 'stall') && fault.amount > CHAOS_LEASE.ttlMs);
    const leaseVictim = leaseHolder === workerName && takesHolderOut ? workerName : undefined;
    let jobs: string[] = [];
    switch (fault.kind) {
      case 'kill': {
        if (!slot.alive || slots.filter((s) => s.alive).length < 2) continue;
        jobs = (await lockedJobs('a.application_name = $1', [`chaos-w${slot.index}`]))
          .map((l) => l.job)
          .filter((j): j is string => j !== undefined && j !== 'lease');
        slot.process?.kill('SIGKILL');
        slot.alive = false;
        pending.push(sleep(1500).then(() => spawnWorker(slot)));
        break;
      }
      case 'stop': {
        if (!slot.alive || slot.stopped) continue;
        slot.process?.kill('SIGSTOP');
        slot.stopped = true;
        const resumed = sleep(fault.amount).then(() => {
          if (slot.alive) slot.process?.kill('SIGCONT');
          slot.stopped = false;
        });
        pending.push(resumed);
        break;
      }
      case 'terminate': {
        // Locks are held for a moment each second: look until one is.
        let holders: Awaited<ReturnType<typeof lockedJobs>> = [];
        for (let look = 0; look < 40 && holders.length === 0; look++) {
          holders = await lockedJobs("a.application_name LIKE 'chaos-w%'", []);
          if (holders.length === 0) await sleep(50);
        }
        const victim = holders[fault.atMs % Math.max(1, holders.length)];
        if (!victim) continue;
        const client = admin();
        await client.connect();
        await client.query('SELECT pg_terminate_backend($1)', [victim.pid]).catch(() => {});
        await client.end().catch(() => {});
        if (victim.job && victim.job !== 'lease') jobs = [victim.job];
        applied.push({
          kind: fault.kind,
          at: Date.now(),
          slot: -1,
          leaseVictim: undefined,
          jobs,
        });
        log(
          `+${((Date.now() - started) / 1000).toFixed(1)} s  terminate backend ${victim.pid} (${victim.job ?? 'another lock'})`,
        );
        continue;
      }
      case 'restart': {
        const down = Date.now();
        await server.restart('immediate', fault.amount);
        downtime.push([down, Date.now()]);
        break;
      }
      case 'drop':
        slot.proxy.drop();
        break;
      case 'stall':
        slot.proxy.stall(fault.amount);
        break;
      case 'skew':
        if (!slot.alive) continue;
        slot.skewMs = fault.amount;
        slot.process?.send({ type: 'skew', skewMs: fault.amount });
        break;
    }
    applied.push({
      kind: fault.kind,
      at: Date.now(),
      slot: slot.index,
      leaseVictim,
      jobs,
    });
    log(
      `+${((Date.now() - started) / 1000).toFixed(1)} s  ${fault.kind.padEnd(9)} ${fault.kind === 'restart' ? '' : workerName}${fault.amount ? ` (${fault.amount})` : ''}`,
    );
  }
  const endAt = started + durationMs;
  if (endAt > Date.now()) await sleep(endAt - Date.now());
  await Promise.all(pending);
  // Faults late in the run leave ticks for catch-up, which a loaded machine reaches later than an
  // idle one. Wait for every judged tick to be decided (run, or recorded with a final status) —
  // an event, not a window — and judge what is still undecided after the drain limit as missed.
  const jobs = Array.from({ length: o.jobs }, (_, j) => chaosJobName(j));
  await untilDecided(
    server.url,
    SCHEMA,
    jobs,
    judgedWindow(started, judgedSeconds),
    DRAIN_LIMIT_MS,
  );

  // Stop every worker cleanly; then nothing of theirs may be left in the server.
  for (const slot of slots) if (slot.alive && slot.stopped) slot.process?.kill('SIGCONT');
  await Promise.all(
    slots.map(async (slot) => {
      if (!slot.alive || !slot.process) return;
      const child = slot.process;
      const exited = new Promise((r) => child.once('exit', r));
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), 20_000);
      await exited;
      clearTimeout(timer);
    }),
  );
  observing = false;
  await observer;

  return judge(o, server.url, started, judgedSeconds, applied, downtime, messages, slots, {
    exclusivityViolations,
    samples,
  });
}

/** The instants (ms) of the first and last judged ticks of a run that started at `started`. */
function judgedWindow(started: number, judgedSeconds: number): { from: number; to: number } {
  const from = Math.ceil((started + WARM_UP_MS) / 1000) * 1000;
  return { from, to: from + (judgedSeconds - 1) * 1000 };
}

async function judge(
  o: Options,
  url: string,
  started: number,
  judgedSeconds: number,
  applied: readonly AppliedFault[],
  downtime: readonly [number, number][],
  messages: readonly (WorkerMessage & { worker: string })[],
  slots: readonly Slot[],
  observed: { exclusivityViolations: number; samples: number },
) {
  const client = new pg.Client({ connectionString: url, application_name: 'chaos-judge' });
  await client.connect();
  try {
    const { from, to } = judgedWindow(started, judgedSeconds);
    const { rows: executions } = await client.query<{ job: string; tick: Date; n: number }>(
      `SELECT job, tick, count(*)::int AS n FROM "${SCHEMA}".executions
        WHERE tick BETWEEN $1 AND $2 GROUP BY job, tick`,
      [new Date(from), new Date(to)],
    );
    const { rows: ledger } = await client.query<{ job: string; tick: Date; status: string }>(
      `SELECT job, tick, status FROM "${SCHEMA}".runs WHERE tick BETWEEN $1 AND $2`,
      [new Date(from), new Date(to)],
    );
    const ran = new Map(executions.map((e) => [`${e.job}@${new Date(e.tick).getTime()}`, e.n]));
    const status = new Map(ledger.map((r) => [`${r.job}@${new Date(r.tick).getTime()}`, r.status]));
    let due = 0;
    let executed = 0;
    let duplicates = 0;
    let missed = 0;
    let overlapSkipped = 0;
    let failed = 0;
    const missedTicks: string[] = [];
    for (let j = 0; j < o.jobs; j++) {
      for (let t = from; t <= to; t += 1000) {
        const id = `${chaosJobName(j)}@${t}`;
        due++;
        const n = ran.get(id) ?? 0;
        if (n > 0) executed++;
        if (n > 1) duplicates += n - 1;
        if (n > 0) continue;
        const s = status.get(id);
        if (s === 'SKIPPED_OVERLAP') overlapSkipped++;
        else if (s === 'FAILED') failed++;
        else {
          missed++;
          if (missedTicks.length < 10) missedTicks.push(`${id} (${s ?? 'no ledger row'})`);
        }
      }
    }

    // Fencing: accepted writes never go back to an older token; claims never reuse one.
    const { rows: writes } = await client.query<{ token: string }>(
      `SELECT token FROM "${SCHEMA}".lease_writes ORDER BY id`,
    );
    let highest = -1n;
    let staleWritesAccepted = 0;
    for (const w of writes) {
      const token = BigInt(w.token);
      if (token < highest) staleWritesAccepted++;
      if (token > highest) highest = token;
    }
    const claims = messages.filter((m) => m.type === 'lease-claimed').sort((a, b) => a.at - b.at);
    const claimTokens = claims.map((m) => BigInt(m.token ?? '0'));
    let tokenViolations = new Set(claimTokens.map(String)).size === claimTokens.length ? 0 : 1;
    for (let i = 1; i < claimTokens.length; i++) {
      if ((claimTokens[i] as bigint) <= (claimTokens[i - 1] as bigint)) tokenViolations++;
    }
    const staleWritesRefused = messages.filter((m) => m.type === 'stale-write-refused').length;
    // Attempts at a judged tick that failed for want of the database (the tick stays free), and
    // how many of those ticks were then run late by catch-up, after the ticks that followed them.
    const judged = (m: WorkerMessage) =>
      m.job !== undefined && m.tick !== undefined && m.tick >= from && m.tick <= to;
    const tickErrors = messages.filter((m) => m.type === 'error' && judged(m)).length;
    // Which workers those attempts failed on: one worker failing every tick while the others
    // run is a defect of that worker's pool, not the faults'.
    const tickErrorsByWorker: Record<string, number> = {};
    for (const m of messages)
      if (m.type === 'error' && judged(m))
        tickErrorsByWorker[m.worker] = (tickErrorsByWorker[m.worker] ?? 0) + 1;
    // Workers that died of an error of their own (no fault kills that way).
    const workerCrashes = messages
      .filter((m) => m.type === 'fatal')
      .map((m) => ({ worker: m.worker, error: (m.error ?? '').slice(0, 2000) }));
    if (o.dump !== undefined) {
      const { rows: runs } = await client.query(
        `SELECT * FROM "${SCHEMA}".runs ORDER BY job, tick`,
      );
      writeFileSync(
        o.dump,
        JSON.stringify({ started, judged: { from, to }, applied, messages, runs, executions }),
      );
    }
    const ranLate = new Set(
      messages
        .filter((m) => m.type === 'ran' && judged(m) && m.at - (m.tick as number) > 2000)
        .map((m) => `${m.job}@${m.tick}`),
    ).size;

    // Recovery: from a fault that hit a holder to the next holder's start.
    const leaseTakeovers: number[] = [];
    for (const f of applied.filter((a) => a.leaseVictim)) {
      const next = claims.find((c) => c.at > f.at && c.worker !== f.leaseVictim);
      if (next) leaseTakeovers.push(next.at - f.at);
    }
    const { rows: firstRuns } = await client.query<{ job: string; executed_at: Date }>(
      `SELECT job, executed_at FROM "${SCHEMA}".executions ORDER BY executed_at`,
    );
    const txTakeovers: number[] = [];
    for (const f of applied) {
      for (const job of f.jobs) {
        const next = firstRuns.find(
          (r) => r.job === job && new Date(r.executed_at).getTime() > f.at,
        );
        if (next) txTakeovers.push(new Date(next.executed_at).getTime() - f.at);
      }
    }

    // Leaks: nothing of the workers may remain, once they are gone.
    let leakedLocks = 0;
    let leakedConnections = 0;
    for (let attempt = 0; attempt < 50; attempt++) {
      const { rows } = await client.query<{ locks: number; connections: number }>(
        `SELECT (SELECT count(*)::int FROM pg_locks WHERE locktype = 'advisory') AS locks,
                (SELECT count(*)::int FROM pg_stat_activity WHERE application_name LIKE 'chaos-w%') AS connections`,
      );
      leakedLocks = rows[0]?.locks ?? 0;
      leakedConnections =
        (rows[0]?.connections ?? 0) + slots.reduce((n, s) => n + s.proxy.connections(), 0);
      if (leakedLocks === 0 && leakedConnections === 0) break;
      await sleep(100);
    }

    const faults = Object.fromEntries(
      FAULT_KINDS.map((k) => [k, applied.filter((a) => a.kind === k).length]),
    );
    const max = (xs: number[]) => (xs.length ? Math.max(...xs) : null);
    const median = (xs: number[]) =>
      xs.length ? ([...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] as number) : null;
    const ok = invariantsHeld(
      {
        duplicates,
        missed,
        failed,
        staleWritesAccepted,
        tokenViolations,
        exclusivityViolations: observed.exclusivityViolations,
        leakedLocks,
        leakedConnections,
        workerCrashes,
        faults,
      },
      FAULT_KINDS,
    );
    const verdict = {
      ok,
      seed: o.seed,
      adapter: o.adapter,
      distribution: o.distribution,
      workers: o.workers,
      jobs: o.jobs,
      ticks: due,
      executed,
      duplicates,
      missed,
      overlapSkipped,
      failed,
      faults,
      faultsTotal: applied.length,
      serverDowntimeMs: downtime.reduce((n, [a, b]) => n + (b - a), 0),
      maxTakeoverMs: max([...leaseTakeovers, ...txTakeovers]),
      takeoverMs: {
        lease: {
          count: leaseTakeovers.length,
          median: median(leaseTakeovers),
          max: max(leaseTakeovers),
        },
        transaction: {
          count: txTakeovers.length,
          median: median(txTakeovers),
          max: max(txTakeovers),
        },
      },
      tickErrors,
      tickErrorsByWorker,
      workerCrashes,
      ranLate,
      leaseClaims: claims.length,
      fencedWrites: writes.length,
      staleWritesRefused,
      staleWritesAccepted,
      tokenViolations,
      exclusivityViolations: observed.exclusivityViolations,
      observerSamples: observed.samples,
      leakedLocks,
      leakedConnections,
      ...(missedTicks.length > 0 && { missedTicks }),
    };
    if (!o.json) {
      process.stdout.write(
        [
          '',
          `verdict (seed ${o.seed}): ${ok ? 'every invariant held' : 'INVARIANTS VIOLATED'}`,
          `  ticks ${due}: executed ${executed}, duplicates ${duplicates}, missed ${missed}, skipped as overlapping ${overlapSkipped}, failed ${failed}`,
          `  faults: ${FAULT_KINDS.map((k) => `${k} ${faults[k]}`).join(', ')}; server down ${verdict.serverDowntimeMs} ms in all`,
          `  attempts that failed for want of the database: ${tickErrors}; ticks run more than 2 s late: ${ranLate}`,
          `  those attempts by worker: ${
            Object.entries(tickErrorsByWorker)
              .map(([w, n]) => `${w} ${n}`)
              .join(', ') || 'none'
          }`,
          ...workerCrashes.map((c) => `  worker ${c.worker} crashed: ${c.error}`),
          `  takeover after a holder was hit: lease median ${verdict.takeoverMs.lease.median} ms, max ${verdict.takeoverMs.lease.max} ms; transaction median ${verdict.takeoverMs.transaction.median} ms, max ${verdict.takeoverMs.transaction.max} ms`,
          `  lease: ${claims.length} claims, ${writes.length} fenced writes, ${staleWritesRefused} stale writes refused, ${staleWritesAccepted} accepted; token order violations ${tokenViolations}`,
          `  observer: ${observed.samples} samples of pg_locks, ${observed.exclusivityViolations} with two holders of one lock`,
          `  leaks at the end: ${leakedLocks} advisory locks, ${leakedConnections} connections`,
          ...(missedTicks.length ? [`  missed: ${missedTicks.join(', ')}`] : []),
          '',
        ].join('\n'),
      );
    }
    return verdict;
  } finally {
    await client.end();
  }
}

main().catch((error: unknown) => {
  process.stderr.write(
    `lockkit chaos failed: ${error instanceof Error ? error.stack : String(error)}\n`,
  );
  process.exit(1);
});
