/**
 * The fault-point group for leases: `runWithLease` searched statement by statement, as
 * `fault-points.ts` searches the lock protocols. One run is a claim, then a task that makes one
 * fenced write and waits for one renewal of its lease, then the finish; its statements are
 * recorded through the suite's TCP proxy, and for every boundary k of that recording and every
 * fault kind the run happens again with exactly that one fault at statement k.
 *
 * The judge reads the lease row and the fenced writes through the fixture's observer, never the
 * adapter: `executed: true` only when the row shows this run's token COMPLETED and its fenced
 * write is there; a rejection only with a {@link LockkitError} code that tells the truth against
 * the row; the fenced write committed at most once, and only while its token held the lease (the
 * write itself reads the row inside the fenced transaction); no lease left IN_PROGRESS unless the
 * call said its outcome was unknown or its lease lost; nothing left behind (advisory locks, connections); and the
 * next `runWithLease` gets a token above every token granted before and runs — after the lease
 * expired, when a claim whose COMMIT answer was lost left it held (nobody can know its holder is
 * gone, so waiting for the expiry is the protocol, not the test's choice).
 *
 * Where the fault holds the run's statement or its answer (late-reply, terminated, aborted), a
 * rival claims the same lease right then, from another instance: it must be refused while the
 * database shows the lease held (or the run's claim transaction holds the job's lock), must run
 * when it is free, and must never wait on the held party.
 */
import { randomBytes } from 'node:crypto';
import {
  createLockClient,
  isLockkitError,
  type LeaseContext,
  type LeaseResult,
  type LockkitEvent,
} from '@lockkit/core';
import { afterAll, expect, onTestFinished } from 'vitest';
import { judgeLeftovers } from '../fault-invariants.js';
import {
  type AdapterInstance,
  type ConformanceAdapter,
  type FaultKind,
  type FaultProtocolId,
  taggedUrl,
} from '../harness.js';
import { startRoundTripProxy, type WireFault } from '../proxy.js';
import { casesOf, type Fixture, withLockkitSchema } from '../suite.js';
import { boundaryFromEnv, bounded, drain, head } from './fault-points.js';

/** The lease protocols the group searches, by id: what `faultPointCaseIds` takes for them. */
export const LEASE_FAULT_PROTOCOLS: readonly FaultProtocolId[] = ['run-with-lease'];

/**
 * The lease every run takes. A short TTL bounds the one wait the protocol imposes (a claim whose
 * COMMIT answer was lost holds the lease until it expires: once per drop-after pass); the renewal
 * comes early so that every run renews once without the test waiting long. The default safety
 * margin (600 ms) keeps a claim answered within 1.2 s, and a holder 2.4 s without a renewal: room
 * for a loaded CI machine, where a lost lease would read as a lie in the aborted cases.
 */
const LEASE = { ttlMs: 3000, renewEveryMs: 100 } as const;

const NAMESPACE = 'lockkit-fault-points-leases';

/** Bounds a call that never settles, so that the violation names its point instead of a timeout. */
const WATCHDOG_MS = 5000;

/** How one `runWithLease` settled. */
type LeaseSettled =
  | { readonly kind: 'resolved'; readonly value: LeaseResult<number> }
  | { readonly kind: 'rejected'; readonly error: unknown };

const settle = (promise: Promise<LeaseResult<number>>): Promise<LeaseSettled> =>
  promise.then(
    (value) => ({ kind: 'resolved', value }),
    (error: unknown) => ({ kind: 'rejected', error }),
  );

const watched = (call: Promise<LeaseSettled>): Promise<LeaseSettled> =>
  bounded(
    call,
    {
      kind: 'rejected',
      error: new Error(`the call did not settle within ${WATCHDOG_MS} ms`),
    },
    WATCHDOG_MS,
  );

/** A short, stable name of an outcome: `executed`, `skipped`, or the error's code (or class). */
function outcomeName(outcome: LeaseSettled): string {
  if (outcome.kind === 'resolved') return outcome.value.executed ? 'executed' : 'skipped';
  const error = outcome.error;
  if (isLockkitError(error)) return error.code;
  return `not a LockkitError: ${error instanceof Error ? `${error.name}: ${error.message}` : String(error)}`;
}

/** A fault kind: the proxy trap it sets on statement k, and what follows once the trap acted. */
interface LeaseFault {
  readonly id: FaultKind;
  readonly title: string;
  readonly wire: WireFault;
  /** After the trap fired: `abort` the caller's signal, or `terminate` the run's backends. */
  readonly action?: 'abort' | 'terminate';
  /** Codes that can tell the truth about this fault (each also judged against the lease row). */
  readonly honestCodes: readonly string[];
}

/** A lost link: the statement, the COMMIT's outcome, or the lease itself may be gone. */
const LINK_CODES = ['CONNECTION_LOST', 'COMMIT_OUTCOME_UNKNOWN', 'LEASE_LOST'];

const FAULTS: readonly LeaseFault[] = [
  {
    id: 'drop-before',
    title: 'the link is cut before statement k reaches the server',
    wire: 'drop-before',
    honestCodes: LINK_CODES,
  },
  {
    id: 'drop-after',
    title: 'the server runs statement k, the link is cut before its answer arrives',
    wire: 'drop-after',
    honestCodes: LINK_CODES,
  },
  {
    id: 'late-reply',
    title:
      "the server runs statement k, its answer is held (a rival claims meanwhile) past the caller's timeout (its signal fires), then delivered",
    wire: 'hold-reply',
    action: 'abort',
    honestCodes: ['ABORTED'],
  },
  {
    id: 'terminated',
    title:
      'statement k is held before the server (a rival claims meanwhile), then the backend is terminated from outside',
    wire: 'hold-statement',
    action: 'terminate',
    honestCodes: LINK_CODES,
  },
  {
    id: 'aborted',
    title:
      "statement k is held before the server (a rival claims meanwhile), then the caller's signal fires",
    wire: 'hold-statement',
    action: 'abort',
    honestCodes: ['ABORTED'],
  },
];

/** The lease row as the observer reads it. */
interface LeaseRow {
  readonly token: bigint;
  readonly status: string;
  /** IN_PROGRESS and not expired, by the database clock. */
  readonly valid: boolean;
}

/** One fenced write as committed: its token, and the lease row as the write's transaction read it. */
interface FencedWrite {
  readonly token: bigint;
  readonly leaseToken: bigint | null;
  readonly leaseStatus: string | null;
}

/**
 * Declares the lease fault-point tests (one per fault kind, looping over the boundaries). Logs
 * how many (operation, boundary, fault) combinations each covered, and the group's total.
 */
export function leaseFaultPointCases<Tx, Session>(
  adapter: ConformanceAdapter<Tx, Session>,
  fixture: () => Fixture<Tx, Session>,
): void {
  const test = casesOf(adapter);
  let covered = 0;
  afterAll(() => {
    if (covered > 0)
      console.log(
        `[lockkit fault points] ${adapter.name}: ${covered} lease (operation, boundary, fault) combinations covered`,
      );
  });
  for (const fault of FAULTS) {
    test(
      `faults.run-with-lease.${fault.id}`,
      `run-with-lease (claim, fenced write, renewal, finish): at every statement boundary k, ${fault.title}; the call tells the truth against the lease row, fences its write, leaves nothing behind, and the next claim gets a higher token and runs`,
      () =>
        withLockkitSchema(fixture(), async (schema) => {
          const f = fixture();
          await f.observer.query(
            `CREATE TABLE "${schema}".fenced_writes (run int NOT NULL, token int8 NOT NULL, lease_token int8, lease_status text)`,
          );
          const proxy = await startRoundTripProxy(f.url);
          // Closed after the fixture's checks, which may still talk through it.
          onTestFinished(() => proxy.close());
          // A pool of one, so that every run sends the same statements in the same order (the
          // renewal waits for the fenced write's connection). Closed here, bounded: a connection a
          // fault leaked is reported below and must not hang the close.
          const instance = f.adapter.createInstance({ url: proxy.url, poolSize: 1 });
          try {
            await searchLeaseFaultPoints(f, schema, fault, proxy, instance, (n) => {
              covered += n;
            });
          } finally {
            await bounded(
              instance.close().catch(() => undefined),
              undefined,
              500,
            );
          }
        }),
      90_000,
    );
  }
}

/** Records the run's statements, then runs it once per boundary with the fault there. */
async function searchLeaseFaultPoints<Tx, Session>(
  f: Fixture<Tx, Session>,
  schema: string,
  fault: LeaseFault,
  proxy: Awaited<ReturnType<typeof startRoundTripProxy>>,
  instance: AdapterInstance<Tx, Session>,
  count: (combinations: number) => void,
): Promise<void> {
  const jobKey = randomBytes(8).toString('hex');
  // Renewals seen, by token: a run's task waits for its lease's first one.
  const renewed = new Map<bigint, number>();
  const wakers = new Set<() => void>();
  const onEvent = (event: LockkitEvent) => {
    if (event.type !== 'lease-renewed' || event.jobKey !== jobKey) return;
    renewed.set(event.token, (renewed.get(event.token) ?? 0) + 1);
    for (const wake of [...wakers]) wake();
  };
  const locks = createLockClient(instance.executor, { schema, engineSelfTest: false, onEvent });
  // The rival: its own instance and application_name, so a fault's termination spares it, not
  // through the proxy, so that it shifts no statement count.
  const rivalName = `${f.applicationName}-rival`;
  const rivalInstance = f.newInstance(1, taggedUrl(f.adapter.databaseUrl(), rivalName));
  const rival = createLockClient(rivalInstance.executor, { schema, engineSelfTest: false });

  const leaseRow = async (): Promise<LeaseRow | undefined> => {
    const [row] = await f.observer.query<{ token: string; status: string; valid: boolean }>(
      `SELECT token::text AS token, status,
              (status = 'IN_PROGRESS' AND expires_at > clock_timestamp()) AS valid
         FROM "${schema}".leases WHERE namespace = $1 AND job_key = $2`,
      [NAMESPACE, jobKey],
    );
    return row && { token: BigInt(row.token), status: row.status, valid: row.valid };
  };
  const writesOf = async (run: number): Promise<FencedWrite[]> =>
    (
      await f.observer.query<{
        token: string;
        lease_token: string | null;
        lease_status: string | null;
      }>(
        `SELECT token::text AS token, lease_token::text AS lease_token, lease_status
           FROM "${schema}".fenced_writes WHERE run = $1`,
        [run],
      )
    ).map((w) => ({
      token: BigInt(w.token),
      leaseToken: w.lease_token === null ? null : BigInt(w.lease_token),
      leaseStatus: w.lease_status,
    }));

  /** The task's one fenced write: it stores its token and the lease row as its transaction sees it. */
  const fencedWrite = (lease: LeaseContext<Tx>, run: number) =>
    lease.fenced((_tx, query) =>
      query(
        `INSERT INTO "${schema}".fenced_writes (run, token, lease_token, lease_status)
         SELECT $1::int, $2::int8, token, status FROM "${schema}".leases
          WHERE namespace = $3 AND job_key = $4`,
        [run, String(lease.token), NAMESPACE, jobKey],
      ),
    );
  /** Resolves once `lease` was renewed, or its signal fired (the task then returns early). */
  const firstRenewal = (lease: LeaseContext<Tx>) =>
    new Promise<void>((resolve) => {
      const wake = () => {
        if ((renewed.get(lease.token) ?? 0) === 0 && !lease.signal.aborted) return;
        wakers.delete(wake);
        lease.signal.removeEventListener('abort', wake);
        resolve();
      };
      wakers.add(wake);
      lease.signal.addEventListener('abort', wake);
      wake();
    });

  /** What a run's task saw: its token, whether it took an expired lease over. */
  interface Seen {
    token?: bigint;
    tookOver?: boolean;
  }
  /** The searched run: claim, one fenced write, one renewal, finish. */
  const searched = (run: number, seen: Seen, signal: AbortSignal) =>
    locks.runWithLease(
      NAMESPACE,
      jobKey,
      async (lease) => {
        seen.token = lease.token;
        seen.tookOver = lease.tookOver;
        await fencedWrite(lease, run);
        await firstRenewal(lease);
        return run;
      },
      { ...LEASE, signal },
    );

  let nextRun = 0;
  // The highest token granted so far, to anyone (this party, the rival, a claim left behind).
  let granted = 0n;
  const grant = (token: bigint | undefined) => {
    if (token !== undefined && token > granted) granted = token;
  };

  /**
   * A run without fault that must execute (the warm-up, and the next caller after each fault):
   * with a token above every one granted before, its finish and fenced write in the database.
   * `full` runs the searched task (renewal included); otherwise just the fenced write.
   */
  const cleanRun = async (full: boolean, mustTakeOver = false): Promise<string[]> => {
    const run = ++nextRun;
    const seen: Seen = {};
    const call = full
      ? searched(run, seen, new AbortController().signal)
      : locks.runWithLease(
          NAMESPACE,
          jobKey,
          async (lease) => {
            seen.token = lease.token;
            seen.tookOver = lease.tookOver;
            await fencedWrite(lease, run);
            return run;
          },
          LEASE,
        );
    const outcome = await watched(settle(call));
    const before = granted;
    grant(seen.token);
    if (outcome.kind !== 'resolved' || !outcome.value.executed)
      return [`the next caller could not run: ${outcomeName(outcome)}`];
    const found: string[] = [];
    if (outcome.value.token <= before)
      found.push(`the next caller got token ${outcome.value.token}, not above ${before}`);
    if (mustTakeOver && seen.tookOver !== true)
      found.push('the next caller took an expired lease without being told it took it over');
    const row = await leaseRow();
    if (row?.token !== outcome.value.token || row.status !== 'COMPLETED')
      found.push(
        `the next caller executed, but the lease row shows ${row ? `${row.status} under ${row.token}` : 'nothing'}`,
      );
    if ((await writesOf(run)).length !== 1)
      found.push('the next caller executed, but its fenced write is not in the database once');
    return found;
  };

  // Warm up (the driver's first queries, the claim's timeline probe; the rival's too), then record.
  expect(await bounded(cleanRun(true), ['no warm-up in 20 s'], 20_000), 'warm-up run').toEqual([]);
  const rivalWarm = await bounded(
    settle(rival.runWithLease(NAMESPACE, jobKey, (lease) => Number(lease.token), LEASE)),
    { kind: 'rejected', error: new Error('no rival warm-up in 20 s') },
    20_000,
  );
  expect(outcomeName(rivalWarm), 'rival warm-up run').toBe('executed');
  if (rivalWarm.kind === 'resolved' && rivalWarm.value.executed) grant(rivalWarm.value.token);
  const recorder = proxy.record();
  expect(await cleanRun(true), 'recorded run').toEqual([]);
  const recorded = recorder.stop();
  expect(recorded.length, 'statements recorded').toBeGreaterThan(0);

  /**
   * The rival's claim while the run is held at its statement: refused while the database shows
   * the lease valid or the run's claim transaction holds the job's lock; run otherwise; never
   * waiting on the held party.
   */
  const rivalClaim = async (): Promise<{
    found: string[];
    saw: LeaseRow | undefined;
    ran: boolean;
  }> => {
    const row = await leaseRow();
    const locked = (await f.observer.locksOf(f.applicationName)).some((l) => l.granted);
    const mustRefuse = row?.valid === true || locked;
    const outcome = await watched(
      settle(rival.runWithLease(NAMESPACE, jobKey, (lease) => Number(lease.token), LEASE)),
    );
    const found: string[] = [];
    const state = `${row ? `${row.status} under ${row.token}${row.valid ? ', valid' : ''}` : 'no row'}${locked ? ', job lock held' : ''}`;
    if (outcome.kind === 'rejected')
      found.push(`the rival's claim failed: ${outcomeName(outcome)}`);
    else if (outcome.value.executed) {
      if (mustRefuse) found.push(`a rival claimed and ran while the lease was held (${state})`);
      if (outcome.value.token <= granted)
        found.push(`the rival got token ${outcome.value.token}, not above ${granted}`);
      grant(outcome.value.token);
    } else if (!mustRefuse) found.push(`a rival was refused a free lease (${state})`);
    found.push(
      ...(await judgeLeftovers(f.observer, rivalName, rivalInstance)).map((v) => `rival: ${v}`),
    );
    return { found, saw: row, ran: outcome.kind === 'resolved' && outcome.value.executed };
  };

  const only = boundaryFromEnv();
  const violations: string[] = [];
  const outcomes: string[] = [];
  let combinations = 0;
  for (let k = 0; k < recorded.length; k++) {
    if (only !== undefined && k !== only) continue;
    const point = `run-with-lease / boundary ${k} (${head(recorded[k])}) / ${fault.id}`;
    const found: string[] = [];
    const run = ++nextRun;
    const seen: Seen = {};
    const controller = new AbortController();
    const before = granted;
    // The lease row as the rival found it, when one claimed: a run whose finish had committed
    // then may see the rival's later claim in the row once it settles.
    let rivalSaw: LeaseRow | undefined;
    // How the rival fared, for the log: '+' it ran, '-' it was refused.
    let rivalMark = '';
    const trap = proxy.trapStatement(k, fault.wire);
    const call = settle(searched(run, seen, controller.signal));
    const first = await Promise.race([trap.fired, watched(call).then(() => undefined)]);
    if (first === undefined) {
      trap.release();
      found.push(
        'the call settled before statement k was sent: the recording is not deterministic',
      );
    } else {
      if (first.text !== recorded[k]?.text)
        found.push(
          `statement k was '${head(first)}' in this run: the recording is not deterministic`,
        );
      if (fault.wire === 'hold-statement' || fault.wire === 'hold-reply') {
        const rivalled = await rivalClaim();
        found.push(...rivalled.found);
        rivalSaw = rivalled.saw;
        rivalMark = rivalled.ran ? ' rival+' : ' rival-';
      }
      if (fault.action === 'abort') {
        controller.abort(new Error('the caller gave up (fault point)'));
        await Promise.race([call, drain()]);
      } else if (fault.action === 'terminate') {
        await f.observer.query(
          `SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity
            WHERE application_name = $1 AND pid <> pg_backend_pid()`,
          [f.applicationName],
        );
      }
      trap.release();
    }
    const outcome = await watched(call);
    outcomes.push(`${k}:${outcomeName(outcome)}${rivalMark}`);
    const row = await leaseRow();
    // This run's token: what its task saw, or — the task never started — a token the row shows
    // that nobody had before (only this run claimed since).
    const token = seen.token ?? (row !== undefined && row.token > granted ? row.token : undefined);
    found.push(
      ...judgeLeaseRun({
        outcome,
        token,
        before,
        row,
        rivalSaw,
        writes: await writesOf(run),
        fault,
      }),
    );
    grant(token);
    const leftovers = await judgeLeftovers(f.observer, f.applicationName, instance);
    found.push(...leftovers);
    combinations++;
    violations.push(...found.map((v) => `${point}: ${v}`));
    // A connection still out of a pool of one would wedge every later run: stop here.
    if (leftovers.some((v) => v.includes('checked out'))) break;
    const next = await nextCaller(row);
    violations.push(...next.map((v) => `${point}: ${v}`));
    // A caller after the fault that cannot run: later boundaries would only measure that.
    if (next.length > 0) break;
  }

  /**
   * The next caller after a fault. A lease the faulted run left held (judged above: only a claim
   * whose COMMIT answer was lost may) refuses it, naming that holder, until it expires by the
   * database clock; then the caller takes it over.
   */
  async function nextCaller(row: LeaseRow | undefined): Promise<string[]> {
    if (row?.valid !== true) return cleanRun(false);
    const refused = await watched(settle(locks.runWithLease(NAMESPACE, jobKey, () => 0, LEASE)));
    const found: string[] = [];
    if (refused.kind !== 'resolved' || refused.value.executed)
      found.push(
        `while the lease left held was valid, the next caller was not refused: ${outcomeName(refused)}`,
      );
    else if (refused.value.holder?.token !== row.token)
      found.push(
        `the next caller was refused naming holder ${refused.value.holder?.token}, not ${row.token}`,
      );
    const expired = await f.observer.until(
      async () => (await leaseRow())?.valid === false,
      LEASE.ttlMs + 1000,
    );
    if (!expired) found.push('the lease left held did not expire within its ttl');
    return [...found, ...(await cleanRun(false, true))];
  }

  console.log(
    `[lockkit fault points] ${f.adapter.name} run-with-lease / ${fault.id}: ${combinations} boundaries [${outcomes.join(' ')}]`,
  );
  count(combinations);
  // The violations in the message too: a digest that keeps only the assertion line still names them.
  expect(violations, violations.join(' | ')).toEqual([]);
}

/**
 * Judges one faulted run against the database. `token` is this run's lease token when it claimed
 * one, `before` the highest token granted to anyone before it, `row` the lease row and `writes`
 * this run's fenced writes, read once the call settled. Returns the violations.
 */
function judgeLeaseRun(facts: {
  readonly outcome: LeaseSettled;
  readonly token: bigint | undefined;
  readonly before: bigint;
  readonly row: LeaseRow | undefined;
  readonly rivalSaw: LeaseRow | undefined;
  readonly writes: readonly FencedWrite[];
  readonly fault: LeaseFault;
}): string[] {
  const { outcome, token, before, row, rivalSaw, writes, fault } = facts;
  const found: string[] = [];
  if (token !== undefined && token <= before)
    found.push(`claimed token ${token}, not above ${before} granted before`);
  if (writes.length > 1) found.push(`the fenced write committed ${writes.length} times`);
  for (const w of writes) {
    if (w.token !== token)
      found.push(`a fenced write committed under token ${w.token}, not this run's (${token})`);
    if (w.leaseToken !== w.token || w.leaseStatus !== 'IN_PROGRESS')
      found.push(
        `a fenced write under token ${w.token} committed while the lease row showed ${w.leaseStatus} under ${w.leaseToken}: a stale token`,
      );
  }
  const ours = token !== undefined && row?.token === token;
  // Recorded COMPLETED under this run's token: in the row now, or in the row a rival found
  // before it claimed the lease this run had finished.
  const recorded = [row, rivalSaw].some((r) => r?.token === token && r?.status === 'COMPLETED');
  if (outcome.kind === 'resolved') {
    const value = outcome.value;
    if (!value.executed) {
      found.push('skipped ({ executed: false }) with no rival holding the lease');
      return found;
    }
    if (value.token !== token)
      found.push(`executed under token ${value.token}, but its task ran under ${token}`);
    if (!recorded || token === undefined)
      found.push(
        `executed: true, but the lease row shows ${row ? `${row.status} under ${row.token}` : 'nothing'}`,
      );
    if (writes.length !== 1)
      found.push('executed: true, but the fenced write is not in the database');
    return found;
  }
  const error = outcome.error;
  if (!isLockkitError(error)) {
    found.push(`rejected with ${outcomeName(outcome)}`);
    return found;
  }
  const code = error.code;
  if (!fault.honestCodes.includes(code))
    found.push(`rejected ${code}, not one of ${fault.honestCodes.join(', ')}: ${error.message}`);
  if (recorded && code !== 'COMMIT_OUTCOME_UNKNOWN')
    found.push(`rejected ${code}, but the run was recorded COMPLETED under its token`);
  if (code === 'CONNECTION_LOST' && writes.length > 0)
    found.push('rejected CONNECTION_LOST, but the fenced write committed');
  if (code === 'ABORTED' && token !== undefined && !(ours && row?.status === 'FAILED'))
    found.push(
      `rejected ABORTED, but the run is not recorded FAILED (the row shows ${row ? `${row.status} under ${row.token}` : 'nothing'})`,
    );
  // A claim whose COMMIT answer was lost cannot give its lease back; nor can a holder that gave
  // up at its local deadline, which comes before the database's expiry by design.
  if (ours && row?.valid === true && code !== 'COMMIT_OUTCOME_UNKNOWN' && code !== 'LEASE_LOST')
    found.push(
      `rejected ${code}, yet left its lease held (IN_PROGRESS under ${token}) until it expires: only an unknown COMMIT outcome or a lost lease may`,
    );
  return found;
}
