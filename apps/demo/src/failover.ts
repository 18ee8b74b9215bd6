/**
 * `pnpm chaos --failover`: the chaos workers run their jobs — per-second ticks in transaction mode
 * and in lease mode, and a long lease with fenced writes — against a primary with a streaming
 * standby, through a proxy that stands for the address clients connect to. Mid-run the primary is
 * SIGKILLed with every backend (and never restarted), the standby is promoted and the proxy is
 * switched to it, cutting every client connection. Then the run is judged from what the workers
 * reported and from the survivor's tables; the last line of `--json` is the verdict.
 *
 * With `--sync` the standby is synchronous: no commit a worker saw may be missing on the survivor.
 * With `--async` the standby's stream is cut shortly before the kill — what a lagging replica does
 * to a failover, made certain — so what committed on the primary after the cut is lost: the run
 * counts those losses and checks that none is older than the cut, and that nothing lost comes back
 * as a duplicate: no tick runs twice on the survivor and no fencing token is issued twice.
 *
 *   pnpm chaos --failover [--sync|--async] [--adapter pg] [--seed N] [--json]
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { randomInt } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { type ReplicationLag, startReplicatedPair } from '@lockkit/test-db/replicated-pair';
import pg from 'pg';
import { ADAPTERS, type AdapterName, connect } from './adapters.js';
import { chaosJobName, chaosLeaseJobName, seededRandom } from './chaos-plan.js';
import { createChaosTables, untilDecided } from './chaos-tables.js';
import { startFaultProxy } from './fault-proxy.js';
import { onJsonLines } from './json-lines.js';
import { adapterOption, integerOption } from './options.js';

const USAGE = `Usage: pnpm chaos --failover [options]
  --sync | --async  synchronous (default) or asynchronous streaming to the standby
  --jobs N          per-second transaction-mode jobs (default 4)
  --lease-jobs N    per-second lease-mode jobs (default 2)
  --workers N       worker processes (default 3)
  --seed N          when in the second the primary dies (default: random; printed, to replay a run)
  --adapter NAME    ${ADAPTERS.join(' | ')} (default pg)
  --json            print only the verdict, as one JSON object on the last line
`;

const SCHEMA = 'lockkit_failover';
/** Ticks are judged from this long after the workers are ready… */
const WARM_UP_MS = 2000;
/** …the primary dies this long after they are ready (plus up to a second, from the seed)… */
const BEFORE_FAILOVER_MS = 6000;
/** …the standby's stream is cut this long before that (asynchronous mode)… */
const CUT_BEFORE_MS = 1500;
/** …and ticks are judged until this long after the switch; the workers run on a little longer. */
const JUDGED_AFTER_MS = 5000;
const RUN_AFTER_MS = 7000;
/** Longest wait after the run for catch-up to decide the last judged ticks. */
const DRAIN_LIMIT_MS = 30_000;
/**
 * A run acknowledged this long before the stream was cut must have reached the standby: its loss
 * would be more than the replication lag accounts for.
 */
const LAG_GRACE_MS = 1000;

interface Options {
  synchronous: boolean;
  jobs: number;
  leaseJobs: number;
  workers: number;
  seed: number;
  adapter: AdapterName;
  json: boolean;
}

function options(): Options {
  const { values } = parseArgs({
    options: {
      failover: { type: 'boolean', default: true },
      sync: { type: 'boolean', default: false },
      async: { type: 'boolean', default: false },
      jobs: { type: 'string', default: '4' },
      'lease-jobs': { type: 'string', default: '2' },
      workers: { type: 'string', default: '3' },
      seed: { type: 'string' },
      adapter: { type: 'string', default: 'pg' },
      json: { type: 'boolean', default: false },
      help: { type: 'boolean', short: 'h', default: false },
    },
  });
  if (values.help) {
    process.stdout.write(USAGE);
    process.exit(0);
  }
  if (values.sync && values.async) throw new Error('--sync and --async exclude each other');
  const int = integerOption;
  return {
    synchronous: !values.async,
    jobs: int('jobs', values.jobs, 1, 20),
    leaseJobs: int('lease-jobs', values['lease-jobs'], 0, 10),
    workers: int('workers', values.workers, 2, 8),
    seed: values.seed === undefined ? randomInt(2 ** 31) : int('seed', values.seed, 0, 2 ** 32 - 1),
    adapter: adapterOption(values.adapter),
    json: values.json,
  };
}

/** A worker's JSON line, as the parent keeps it. */
interface Message {
  readonly type: string;
  readonly at: number;
  readonly worker: string;
  readonly token?: string;
  readonly lease?: string;
  readonly job?: string;
  readonly tick?: number;
  readonly runId?: string;
  readonly error?: string;
}

/** The moments of the failover, in ms since the epoch. */
interface Timeline {
  readonly started: number;
  readonly cutAt: number | undefined;
  readonly killedAt: number;
  readonly promotedAt: number;
  readonly switchedAt: number;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Runs `pnpm chaos --failover …` and sets the exit code from its verdict. */
export async function failoverCommand(): Promise<void> {
  let o: Options;
  try {
    o = options();
  } catch (error) {
    process.stderr.write(`pnpm chaos --failover: ${(error as Error).message}\n${USAGE}`);
    process.exit(2);
  }
  const log = (line: string) => {
    if (!o.json) process.stdout.write(`${line}\n`);
  };
  const replay = `pnpm chaos --failover ${o.synchronous ? '--sync' : '--async'} --seed ${o.seed} --adapter ${o.adapter} --jobs ${o.jobs} --lease-jobs ${o.leaseJobs} --workers ${o.workers}`;
  log(
    `chaos --failover: seed ${o.seed}, @lockkit/${o.adapter}, ${o.synchronous ? 'synchronous' : 'asynchronous'} standby, ${o.workers} workers, ${o.jobs} transaction-mode + ${o.leaseJobs} lease-mode per-second jobs`,
  );
  const wallStart = Date.now();
  const pair = await startReplicatedPair({ synchronous: o.synchronous });
  const cleanups: (() => Promise<unknown>)[] = [() => pair.stop()];
  const cleanup = async () => {
    for (const c of cleanups.splice(0).reverse()) await c().catch(() => {});
  };
  process.once('SIGINT', () => {
    void cleanup().then(() => process.exit(130));
  });
  try {
    const verdict = await run(o, pair, cleanups, log);
    await cleanup();
    const full = { ...verdict, wallMs: Date.now() - wallStart };
    if (o.json) process.stdout.write(`${JSON.stringify(full)}\n`);
    else log(`  wall time ${(full.wallMs / 1000).toFixed(1)} s`);
    if (!full.ok) {
      process.stderr.write(`chaos --failover: invariants violated. Replay: ${replay}\n`);
      process.exitCode = 1;
    }
  } catch (error) {
    await cleanup();
    process.stderr.write(`chaos --failover: the run failed. Replay: ${replay}\n`);
    throw error;
  }
}

async function run(
  o: Options,
  pair: Awaited<ReturnType<typeof startReplicatedPair>>,
  cleanups: (() => Promise<unknown>)[],
  log: (line: string) => void,
) {
  const setup = connect(o.adapter, pair.primaryUrl, SCHEMA);
  await setup.locks.migrate();
  await setup.close();
  {
    const client = new pg.Client({ connectionString: pair.primaryUrl });
    await client.connect();
    await createChaosTables(client, SCHEMA);
    await client.end();
  }

  // The address the workers connect to: the primary now, the promoted standby after the switch.
  const proxy = await startFaultProxy(pair.primaryUrl);
  cleanups.push(() => proxy.close());
  const messages: Message[] = [];
  const workerFile = fileURLToPath(new URL('./chaos-worker.mjs', import.meta.url));
  const workers: ChildProcess[] = [];
  for (let i = 0; i < o.workers; i++) {
    const name = `w${i}`;
    const url = new URL(proxy.url);
    url.searchParams.set('application_name', `chaos-w${i}`);
    const child = spawn(
      process.execPath,
      [
        workerFile,
        JSON.stringify({
          adapter: o.adapter,
          url: url.toString(),
          schema: SCHEMA,
          worker: name,
          skewMs: Math.round(-300 + (600 * i) / (o.workers - 1)),
          jobs: o.jobs,
          leaseJobs: o.leaseJobs,
        }),
      ],
      { stdio: ['ignore', 'pipe', 'inherit', 'ipc'] },
    );
    workers.push(child);
    onJsonLines<Omit<Message, 'worker'>>(child.stdout, (message) => {
      messages.push({ ...message, worker: name });
      if (message.type === 'fatal') process.stderr.write(`${name}: ${message.error}\n`);
    });
  }
  const stopWorkers = async (signal: 'SIGTERM' | 'SIGKILL') => {
    await Promise.all(
      workers.map(async (child) => {
        if (child.exitCode !== null || child.signalCode !== null) return;
        const exited = new Promise((r) => child.once('exit', r));
        child.kill(signal);
        const timer = setTimeout(() => child.kill('SIGKILL'), 20_000);
        await exited;
        clearTimeout(timer);
      }),
    );
  };
  cleanups.push(() => stopWorkers('SIGKILL'));
  const readyBy = Date.now() + 30_000;
  while (messages.filter((m) => m.type === 'ready').length < o.workers) {
    if (Date.now() > readyBy || workers.some((w) => w.exitCode !== null))
      throw new Error('a worker failed to start');
    await sleep(50);
  }
  const started = Date.now();
  const killAt = started + BEFORE_FAILOVER_MS + Math.floor(seededRandom(o.seed)() * 1000);
  log(`workers ready; the primary dies at +${((killAt - started) / 1000).toFixed(1)} s`);

  // Asynchronous: cut the stream, then let the primary commit on alone — at least one lease claim
  // among it — so that the failover loses those commits.
  let cutAt: number | undefined;
  let lagAtCut: ReplicationLag | undefined;
  if (!o.synchronous) {
    await sleep(Math.max(0, killAt - CUT_BEFORE_MS - Date.now()));
    lagAtCut = await pair.lag();
    cutAt = Date.now();
    await pair.cutReplication();
    log(
      `+${((Date.now() - started) / 1000).toFixed(1)} s  standby's stream cut (lag then ${lagAtCut.bytes} bytes)`,
    );
    const cutDone = Date.now();
    const claimBy = Date.now() + 10_000;
    while (!messages.some((m) => isClaimMessage(m) && m.at > cutDone) && Date.now() < claimBy)
      await sleep(20);
  }
  await sleep(Math.max(0, killAt - Date.now()));
  const lag = await pair.lag();
  const killedAt = Date.now();
  await pair.killPrimary();
  log(
    `+${((killedAt - started) / 1000).toFixed(1)} s  primary SIGKILLed (standby ${lag.syncState}, ${lag.bytes} bytes behind, replay lag ${lag.replayLagMs ?? '—'} ms)`,
  );
  await pair.promote();
  const promotedAt = Date.now();
  proxy.switchTo(pair.standbyUrl);
  const switchedAt = Date.now();
  log(
    `+${((switchedAt - started) / 1000).toFixed(1)} s  standby promoted (${promotedAt - killedAt} ms after the kill), clients switched to it`,
  );
  await sleep(Math.max(0, switchedAt + RUN_AFTER_MS - Date.now()));

  const window = judgedWindow(started, switchedAt);
  const jobs = [
    ...Array.from({ length: o.jobs }, (_, j) => chaosJobName(j)),
    ...Array.from({ length: o.leaseJobs }, (_, j) => chaosLeaseJobName(j)),
  ];
  await untilDecided(pair.standbyUrl, SCHEMA, jobs, window, DRAIN_LIMIT_MS);
  await stopWorkers('SIGTERM');

  return judge(
    o,
    pair.standbyUrl,
    jobs,
    window,
    messages,
    () => proxy.connections(),
    lag,
    lagAtCut,
    {
      started,
      cutAt,
      killedAt,
      promotedAt,
      switchedAt,
    },
  );
}

/** The instants (ms) of the first and last judged ticks. */
function judgedWindow(started: number, switchedAt: number): { from: number; to: number } {
  return {
    from: Math.ceil((started + WARM_UP_MS) / 1000) * 1000,
    to: Math.floor((switchedAt + JUDGED_AFTER_MS) / 1000) * 1000,
  };
}

async function judge(
  o: Options,
  survivorUrl: string,
  jobs: readonly string[],
  window: { from: number; to: number },
  messages: readonly Message[],
  /** Links the workers still have open through the proxy, read again at each look for leaks. */
  proxyConnections: () => number,
  lag: ReplicationLag,
  lagAtCut: ReplicationLag | undefined,
  t: Timeline,
) {
  const client = new pg.Client({ connectionString: survivorUrl, application_name: 'chaos-judge' });
  await client.connect();
  try {
    // Ticks: every due tick of the window ran exactly once on the survivor, or was recorded.
    const { rows: executions } = await client.query<{
      job: string;
      tick: Date;
      run_id: string;
      worker: string;
    }>(`SELECT job, tick, run_id, worker FROM "${SCHEMA}".executions`);
    const { rows: ledger } = await client.query<{
      job: string;
      tick: Date;
      status: string;
      error: string | null;
    }>(`SELECT job, tick, status, error FROM "${SCHEMA}".runs WHERE tick BETWEEN $1 AND $2`, [
      new Date(window.from),
      new Date(window.to),
    ]);
    // Runs of each tick on the survivor, and which of them a worker saw complete ('ran').
    const completedAt = new Map(
      messages.filter((m) => m.type === 'ran' && m.runId).map((m) => [m.runId as string, m.at]),
    );
    const completed = { has: (runId: string) => completedAt.has(runId) };
    // A completion the survivor is sure to have: any, with a synchronous standby; asynchronous,
    // one older than the cut (a newer one may have been lost, and its run is then run again).
    const surelyCompleted = (runId: string) => {
      const at = completedAt.get(runId);
      return at !== undefined && (t.cutAt === undefined || at < t.cutAt - LAG_GRACE_MS);
    };
    const rowsOf = new Map<string, { run_id: string; worker: string }[]>();
    for (const e of executions) {
      const id = `${e.job}@${new Date(e.tick).getTime()}`;
      rowsOf.set(id, [...(rowsOf.get(id) ?? []), e]);
    }
    const runsOf = (id: string) => rowsOf.get(id)?.length ?? 0;
    const status = new Map(ledger.map((r) => [`${r.job}@${new Date(r.tick).getTime()}`, r.status]));
    const errorOf = new Map(ledger.map((r) => [`${r.job}@${new Date(r.tick).getTime()}`, r.error]));
    let due = 0;
    let executed = 0;
    let missed = 0;
    let overlapSkipped = 0;
    let failed = 0;
    const missedTicks: string[] = [];
    const failedTicks: string[] = [];
    for (const job of jobs) {
      for (let tick = window.from; tick <= window.to; tick += 1000) {
        const id = `${job}@${tick}`;
        due++;
        if (runsOf(id) > 0) {
          executed++;
          continue;
        }
        const s = status.get(id);
        if (s === 'SKIPPED_OVERLAP') overlapSkipped++;
        else if (s === 'FAILED') {
          failed++;
          if (failedTicks.length < 10) failedTicks.push(`${id} (${errorOf.get(id) ?? ''})`);
        } else {
          missed++;
          if (missedTicks.length < 10) missedTicks.push(`${id} (${s ?? 'no ledger row'})`);
        }
      }
    }
    // Any tick, in the window or not, that ran more than once on the survivor. A duplicate is a
    // second run of a tick of which some run completed, unless it is the one case lease mode
    // allows: a lease-mode run cut off by the failover after its fenced write but before its
    // finish (or, asynchronous, whose finish was lost) never completed as far as the survivor
    // knows, so the next claim gave its tick back and ran it again (at least once, by design, for
    // a holder that dies mid-run) — counted apart as leaseReruns.
    let duplicates = 0;
    let leaseReruns = 0;
    const duplicateTicks: string[] = [];
    for (const [id, rows] of rowsOf) {
      if (rows.length < 2) continue;
      const done = rows.filter((r) => surelyCompleted(r.run_id)).length;
      const lease = id.startsWith('chaos-lease');
      const extra = rows.length - 1;
      const allowed = lease && done <= 1 ? extra : 0;
      leaseReruns += allowed;
      duplicates += extra - allowed;
      if (duplicateTicks.length < 10)
        duplicateTicks.push(
          `${id} (run by ${rows.map((r) => `${r.worker}${completed.has(r.run_id) ? '' : ' (never completed)'}`).join(', ')})`,
        );
    }

    // Losses: runs a worker saw committed (its 'ran' event) that the survivor does not have.
    const onSurvivor = new Set(executions.map((e) => e.run_id));
    const seen = messages.filter((m) => m.type === 'ran' && m.runId !== undefined);
    const lostRuns = seen.filter((m) => !onSurvivor.has(m.runId as string));
    const lostOutsideLag =
      t.cutAt === undefined
        ? lostRuns.length
        : lostRuns.filter((m) => m.at < (t.cutAt as number) - LAG_GRACE_MS).length;
    const rerunAfterLoss = lostRuns.filter((m) => runsOf(`${m.job}@${m.tick}`) > 0).length;

    // Fencing tokens: every one granted to any worker, by the dead primary or the survivor.
    const claims = messages.filter(isClaimMessage);
    const grants = new Map<string, Message[]>();
    for (const c of claims) {
      const id = `${c.lease}#${c.token}`;
      grants.set(id, [...(grants.get(id) ?? []), c]);
    }
    const reissued = [...grants.entries()].filter(([, g]) => g.length > 1);
    const tokensReissued = reissued.reduce((n, [, g]) => n + g.length - 1, 0);
    const reissuedExamples = reissued.slice(0, 5).map(([id, g]) => ({
      token: id,
      grants: g.map((c) => `${c.worker} at +${c.at - t.started} ms`),
    }));
    const tokensFromOldPrimary = claims.filter((c) => c.at < t.killedAt).length;
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

    // Nothing ran on the standby before its promotion; the time to the first claim on the survivor.
    const ranOnStandby = messages.filter((m) => m.type === 'ran-on-standby').length;
    const after = (m: Message) => m.at >= t.switchedAt;
    const firstAt = (pick: (m: Message) => boolean) => {
      const first = messages.filter((m) => after(m) && pick(m)).sort((a, b) => a.at - b.at)[0];
      return first ? first.at - t.killedAt : null;
    };
    const txJob = (m: Message) => m.type === 'ran' && !!m.job && !m.job.startsWith('chaos-lease');
    const takeover = {
      any: firstAt((m) => m.type === 'ran' || isClaimMessage(m)),
      transaction: firstAt(txJob),
      leaseJob: firstAt((m) => m.type === 'job-lease-claimed'),
      lease: firstAt((m) => m.type === 'lease-claimed'),
    };
    const judged = (m: Message) =>
      m.job !== undefined && m.tick !== undefined && m.tick >= window.from && m.tick <= window.to;
    const tickErrors = messages.filter((m) => m.type === 'error' && judged(m)).length;

    // Leaks: nothing of the workers may remain on the survivor, once they are gone.
    let leakedLocks = 0;
    let leakedConnections = 0;
    for (let attempt = 0; attempt < 50; attempt++) {
      const { rows } = await client.query<{ locks: number; connections: number }>(
        `SELECT (SELECT count(*)::int FROM pg_locks WHERE locktype = 'advisory') AS locks,
                (SELECT count(*)::int FROM pg_stat_activity WHERE application_name LIKE 'chaos-w%') AS connections`,
      );
      leakedLocks = rows[0]?.locks ?? 0;
      // Read at each look: a worker that just exited may not have closed its links yet.
      leakedConnections = (rows[0]?.connections ?? 0) + proxyConnections();
      if (leakedLocks === 0 && leakedConnections === 0) break;
      await sleep(100);
    }

    const ok =
      duplicates === 0 &&
      missed === 0 &&
      failed === 0 &&
      tokensReissued === 0 &&
      staleWritesAccepted === 0 &&
      ranOnStandby === 0 &&
      (o.synchronous ? lostRuns.length === 0 : lostOutsideLag === 0) &&
      takeover.any !== null &&
      leakedLocks === 0 &&
      leakedConnections === 0;
    const verdict = {
      ok,
      mode: 'failover',
      replication: o.synchronous ? 'sync' : 'async',
      seed: o.seed,
      adapter: o.adapter,
      workers: o.workers,
      jobs: o.jobs,
      leaseJobs: o.leaseJobs,
      ticks: due,
      executed,
      duplicates,
      leaseReruns,
      missed,
      overlapSkipped,
      failed,
      committedSeen: seen.length,
      lost: lostRuns.length,
      lostOutsideLag,
      rerunAfterLoss,
      tokensIssued: claims.length,
      tokensFromOldPrimary,
      tokensReissued,
      staleWritesAccepted,
      fencedWrites: writes.length,
      ranOnStandby,
      takeoverMs: takeover.any,
      takeover,
      promoteMs: t.promotedAt - t.killedAt,
      replicationLag: lag,
      ...(lagAtCut && { lagAtCut, cutBeforeKillMs: t.killedAt - (t.cutAt as number) }),
      tickErrors,
      leakedLocks,
      leakedConnections,
      ...(missedTicks.length > 0 && { missedTicks }),
      ...(failedTicks.length > 0 && { failedTicks }),
      ...(duplicateTicks.length > 0 && { duplicateTicks }),
      ...(lostRuns.length > 0 && {
        lostTicks: lostRuns.slice(0, 10).map((m) => `${m.job}@${m.tick}`),
      }),
      ...(reissued.length > 0 && { reissuedTokens: reissuedExamples }),
    };
    if (!o.json) {
      process.stdout.write(
        [
          '',
          `verdict (seed ${o.seed}, ${verdict.replication}): ${ok ? 'every invariant held' : 'INVARIANTS VIOLATED'}`,
          `  ticks ${due}: executed ${executed}, duplicates ${duplicates} (lease-mode runs cut off and run again: ${leaseReruns}), missed ${missed}, skipped as overlapping ${overlapSkipped}, failed ${failed}`,
          `  runs seen committed ${seen.length}: lost on the survivor ${lostRuns.length} (older than the cut: ${lostOutsideLag}), of those run again ${rerunAfterLoss}`,
          `  fencing tokens issued ${claims.length} (${tokensFromOldPrimary} by the old primary), issued twice ${tokensReissued}; stale writes accepted ${staleWritesAccepted}`,
          `  runs on a standby in recovery: ${ranOnStandby}`,
          `  takeover after the kill: first claim ${takeover.any} ms (transaction ${takeover.transaction}, lease job ${takeover.leaseJob}, long lease ${takeover.lease}); promotion ${verdict.promoteMs} ms`,
          `  replication lag at the kill: ${lag.bytes} bytes, replay lag ${lag.replayLagMs ?? '—'} ms (${lag.syncState})`,
          `  leaks at the end: ${leakedLocks} advisory locks, ${leakedConnections} connections`,
          ...(missedTicks.length ? [`  missed: ${missedTicks.join(', ')}`] : []),
          ...(failedTicks.length ? [`  failed: ${failedTicks.join(', ')}`] : []),
          ...(duplicateTicks.length ? [`  run more than once: ${duplicateTicks.join(', ')}`] : []),
          ...(reissued.length ? [`  issued twice: ${JSON.stringify(reissuedExamples)}`] : []),
          '',
        ].join('\n'),
      );
    }
    return verdict;
  } finally {
    await client.end();
  }
}

/** A fencing token granted: a claim of the long lease, or of a lease-mode job's run. */
function isClaimMessage(m: Message): boolean {
  return m.type === 'lease-claimed' || m.type === 'job-lease-claimed';
}
