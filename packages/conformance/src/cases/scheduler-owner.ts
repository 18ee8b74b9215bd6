/**
 * The scheduler with `decide: 'owner'`: one live instance decides each job (rendezvous hashing
 * over the members' heartbeats), the tick protocol still arbitrates. Exactly once across skewed
 * clocks while members join and leave (two deciders for a moment), a stopped-without-cleanup
 * owner's ticks taken over within the documented bound whatever the catch-up policy, and lease
 * mode. Deterministic: hand-set clocks, `runTick` for the timers and `syncMembership` for the
 * heartbeats; no sleep.
 */
import { randomBytes } from 'node:crypto';
import {
  createLockClient,
  createScheduler,
  type LockClient,
  type LockExecutor,
  type Scheduler,
  type SchedulerEvent,
  type SchedulerOptions,
} from '@lockkit/core';
import { expect } from 'vitest';
import type { ConformanceAdapter } from '../harness.js';
import { casesOf, type Fixture, withLockkitSchema } from '../suite.js';

/** A whole minute far from now: no real timer reaches it. */
const BASE = Date.UTC(2031, 0, 1, 0, 0, 0);
const at = (seconds: number) => new Date(BASE + seconds * 1000);

/** A clock a test sets by hand, in seconds after {@link BASE}. */
function handClock(): { now: () => number; set: (seconds: number) => void } {
  let t = BASE;
  return {
    now: () => t,
    set: (s) => {
      t = BASE + Math.round(s * 1000);
    },
  };
}

/** Scheduler cases of `decide: 'owner'`. */
export function schedulerOwnerCases<Tx, Session>(
  adapter: ConformanceAdapter<Tx, Session>,
  fixture: () => Fixture<Tx, Session>,
): void {
  const test = casesOf(adapter);

  const withSchema = (fn: (schema: string, locks: LockClient<Tx, Session>) => Promise<void>) =>
    withLockkitSchema(fixture(), fn, ['executions (job text, tick timestamptz, worker text)']);

  /**
   * Job names of their own: lock keys do not depend on the schema. Random, so which member
   * decides which job is too: a case that needs each of two members to decide some takes 20 (all
   * on one side is about one chance in 500,000), not 8 (one in 128, seen failing); one of three
   * members deciding some takes 36.
   */
  const jobNames = (n: number) => {
    const prefix = `owner-${randomBytes(4).toString('hex')}`;
    return Array.from({ length: n }, (_, i) => `${prefix}-${i}`);
  };

  interface Node {
    readonly name: string;
    readonly scheduler: Scheduler<Tx>;
    readonly events: SchedulerEvent[];
    /** What each run of this node was told. */
    readonly runs: { job: string; tick: number; lateMs: number; catchUp: boolean }[];
  }

  const node = (
    schema: string,
    name: string,
    jobs: readonly string[],
    options: SchedulerOptions,
    mode: 'transaction' | 'lease' = 'transaction',
    wrap: (executor: LockExecutor<Tx, Session>) => LockExecutor<Tx, Session> = (e) => e,
  ): Node => {
    const scheduler = createScheduler(
      createLockClient(wrap(fixture().newInstance(4).executor), { schema }),
      { owner: name, decide: 'owner', ...options },
    );
    const events: SchedulerEvent[] = [];
    const runs: Node['runs'] = [];
    for (const type of ['ran', 'failed', 'missed', 'error', 'skipped-held'] as const)
      scheduler.on(type, (e) => void events.push(e));
    for (const job of jobs) {
      if (mode === 'transaction') {
        scheduler.register(job, '* * * * * *', async (run) => {
          runs.push({ job, tick: run.tick.getTime(), lateMs: run.lateMs, catchUp: run.catchUp });
          await run.query(`INSERT INTO "${schema}".executions VALUES ($1, $2, $3)`, [
            job,
            run.tick.toISOString(),
            name,
          ]);
        });
      } else {
        scheduler.register(
          job,
          '* * * * * *',
          async (run) => {
            runs.push({ job, tick: run.tick.getTime(), lateMs: run.lateMs, catchUp: run.catchUp });
            await run.lease.fenced((_tx, query) =>
              query(`INSERT INTO "${schema}".executions VALUES ($1, $2, $3)`, [
                job,
                run.tick.toISOString(),
                name,
              ]),
            );
          },
          { mode: 'lease' },
        );
      }
    }
    return { name, scheduler, events, runs };
  };

  /** Every node fires `tick` of every job, at once, as their timers would. */
  const fireAll = (nodes: readonly Node[], jobs: readonly string[], tick: Date) =>
    Promise.all(nodes.flatMap((n) => jobs.map((job) => n.scheduler.runTick(job, tick))));

  const deciders = (nodes: readonly Node[], job: string) =>
    nodes.filter((n) => n.scheduler.decides(job)).map((n) => n.name);

  /** Each (job, tick) of `jobs` × `seconds` ran exactly once; no MISSED or other row but SUCCEEDED. */
  const expectExactlyOnce = async (schema: string, jobs: readonly string[], seconds: number[]) => {
    const f = fixture();
    const ran = await f.observer.query<{ job: string; tick: Date; n: number }>(
      `SELECT job, tick, count(*)::int AS n FROM "${schema}".executions GROUP BY job, tick`,
    );
    const count = new Map(ran.map((r) => [`${r.job}@${new Date(r.tick).getTime()}`, r.n]));
    const wrong: string[] = [];
    for (const job of jobs)
      for (const s of seconds) {
        const n = count.get(`${job}@${at(s).getTime()}`) ?? 0;
        if (n !== 1) wrong.push(`${job} tick ${s}: ran ${n} times`);
      }
    expect(wrong, 'ticks not run exactly once').toEqual([]);
    const statuses = await f.observer.query<{ status: string; n: number }>(
      `SELECT status, count(*)::int AS n FROM "${schema}".runs GROUP BY status`,
    );
    expect(statuses).toEqual([{ status: 'SUCCEEDED', n: jobs.length * seconds.length }]);
  };

  test(
    'scheduler.owner-exactly-once',
    "decide 'owner': three instances with clocks ±800 ms apart, a fourth joining and one leaving — each tick runs exactly once, and once every view agrees each job has one decider",
    () =>
      withSchema(async (schema) => {
        const jobs = jobNames(24);
        const clock = handClock();
        const skewed = (ms: number) => () => clock.now() + ms;
        const nodes = (
          [
            ['n0', -800],
            ['n1', 0],
            ['n2', 800],
          ] as const
        ).map(([name, skew]) => node(schema, name, jobs, { now: skewed(skew) }));
        const n1 = nodes[1] as Node;
        // Each tick is fired 900 ms after it is due on the shared clock: due on every skewed one.
        clock.set(0.9);
        for (const n of nodes) await n.scheduler.syncMembership();
        for (const n of nodes)
          expect(await n.scheduler.syncMembership()).toEqual(['n0', 'n1', 'n2']);
        for (const job of jobs) expect(deciders(nodes, job)).toHaveLength(1);
        for (const s of [1, 2, 3]) {
          clock.set(s + 0.9);
          await fireAll(nodes, jobs, at(s));
        }

        // n3 joins: it sees four members, the others still three. The jobs it wins have two
        // deciders for now.
        const n3 = node(schema, 'n3', jobs, { now: skewed(300) });
        nodes.push(n3);
        expect(await n3.scheduler.syncMembership()).toEqual(['n0', 'n1', 'n2', 'n3']);
        const twice = jobs.filter((job) => deciders(nodes, job).length === 2);
        expect(twice.length, 'jobs the newcomer won').toBeGreaterThan(0);
        expect(twice.every((job) => n3.scheduler.decides(job))).toBe(true);
        for (const s of [4, 5]) {
          clock.set(s + 0.9);
          await fireAll(nodes, jobs, at(s));
        }
        for (const n of nodes) await n.scheduler.syncMembership();
        for (const job of jobs) expect(deciders(nodes, job)).toHaveLength(1);
        clock.set(6.9);
        await fireAll(nodes, jobs, at(6));

        // n1 leaves cleanly. Until the others' next heartbeat, nobody fires its jobs' ticks.
        const left = jobs.filter((job) => n1.scheduler.decides(job));
        expect(left.length).toBeGreaterThan(0);
        await n1.scheduler.stop();
        const stayed = nodes.filter((n) => n !== n1);
        clock.set(7.9);
        await fireAll(stayed, jobs, at(7));
        const before = await fixture().observer.query<{ n: number }>(
          `SELECT count(*)::int AS n FROM "${schema}".runs WHERE tick = $1`,
          [at(7)],
        );
        expect(before[0]?.n).toBe(jobs.length - left.length);
        // Their next heartbeat sees n1 gone: its jobs' unclaimed ticks are taken over.
        for (const n of stayed) await n.scheduler.syncMembership();
        for (const job of jobs) expect(deciders(stayed, job)).toHaveLength(1);
        clock.set(8.9);
        await fireAll(stayed, jobs, at(8));

        await Promise.all(stayed.map((n) => n.scheduler.stop()));
        await expectExactlyOnce(schema, jobs, [1, 2, 3, 4, 5, 6, 7, 8]);
        const taken = stayed.flatMap((n) =>
          n.events.filter((e) => e.type === 'ran' && e.tick.getTime() === at(7).getTime()),
        );
        expect(taken).toHaveLength(jobs.length);
        for (const n of nodes)
          expect(n.events.filter((e) => e.type !== 'ran').map((e) => e.type)).toEqual([]);
      }),
    60_000,
  );

  test(
    'scheduler.owner-killed-takeover',
    "decide 'owner': an owner that stops heartbeating without cleanup (as a SIGKILL leaves it) has its ticks run by the next owner within expireMs + 2 × heartbeatMs, none recorded MISSED under catch-up 'skip'",
    () =>
      withSchema(async (schema) => {
        const jobs = jobNames(36);
        const clock = handClock();
        const membership = { heartbeatMs: 1000, expireMs: 5000 };
        const nodes = ['a', 'b', 'c'].map((name) =>
          node(schema, name, jobs, { now: clock.now, membership, catchUpGraceMs: 2000 }),
        );
        const [a, b, c] = nodes as [Node, Node, Node];
        const beat = async (live: readonly Node[]) => {
          for (const n of live) await n.scheduler.syncMembership();
        };
        clock.set(0.5);
        await beat(nodes);
        await beat(nodes);
        for (const s of [1, 2, 3]) {
          clock.set(s + 0.5);
          await beat(nodes);
          await fireAll(nodes, jobs, at(s));
        }
        // a's last heartbeat was at 3.5. From now on it neither beats nor fires: dead.
        const orphans = jobs.filter((job) => a.scheduler.decides(job));
        expect(orphans.length).toBeGreaterThan(0);
        const live = [b, c];
        let takenAt: number | undefined;
        for (const s of [4, 5, 6, 7, 8, 9]) {
          clock.set(s + 0.5);
          await beat(live);
          if (takenAt === undefined && orphans.every((job) => deciders(live, job).length === 1))
            takenAt = s + 0.5;
          await fireAll(live, jobs, at(s));
        }
        // Gone once its heartbeat is expireMs old (at 8.5), seen at the next heartbeat.
        expect(takenAt).toBe(8.5);
        await Promise.all(live.map((n) => n.scheduler.stop()));
        await expectExactlyOnce(schema, jobs, [1, 2, 3, 4, 5, 6, 7, 8, 9]);
        // Its ticks 4 to 8 ran at the takeover, as catch-up runs, each at most expireMs + 2 ×
        // heartbeatMs after it was due.
        const takenOver = live.flatMap((n) =>
          n.runs.filter((r) => orphans.includes(r.job) && r.tick < at(9).getTime()),
        );
        expect(takenOver).toHaveLength(orphans.length * 5);
        expect(takenOver.every((r) => r.catchUp && r.lateMs <= 5000 + 2 * 1000)).toBe(true);
        expect(Math.max(...takenOver.map((r) => r.lateMs))).toBe(4500);
        const missed = live.flatMap((n) => n.events.filter((e) => e.type !== 'ran'));
        expect(missed).toEqual([]);
        await a.scheduler.stop();
      }),
    60_000,
  );

  test(
    'scheduler.owner-takeover-retried',
    "decide 'owner': a takeover whose statement fails (the ledger unreachable) is owed to the next heartbeat, not left to catch-up",
    () =>
      withSchema(async (schema) => {
        const f = fixture();
        const jobs = jobNames(20);
        const clock = handClock();
        const nodes = ['a', 'b'].map((name) => node(schema, name, jobs, { now: clock.now }));
        const [a, b] = nodes as [Node, Node];
        clock.set(0.5);
        for (const n of [...nodes, ...nodes]) await n.scheduler.syncMembership();
        clock.set(1.5);
        await fireAll(nodes, jobs, at(1));
        const left = jobs.filter((job) => b.scheduler.decides(job));
        expect(left.length).toBeGreaterThan(0);
        await b.scheduler.stop();
        clock.set(2.5);
        await fireAll([a], jobs, at(2));
        // The ledger is away while a sees b gone: its takeover statement fails.
        await f.observer.query(`ALTER TABLE "${schema}".runs RENAME TO runs_away`);
        try {
          expect(await a.scheduler.syncMembership()).toEqual(['a']);
        } finally {
          await f.observer.query(`ALTER TABLE "${schema}".runs_away RENAME TO runs`);
        }
        expect(a.events.filter((e) => e.type !== 'ran').map((e) => e.type)).toEqual(['error']);
        // Before tick 3 is due: the takeover owed runs b's tick 2, nothing newer.
        clock.set(2.9);
        await a.scheduler.syncMembership();
        await a.scheduler.stop();
        await expectExactlyOnce(schema, jobs, [1, 2]);
      }),
    60_000,
  );

  test(
    'scheduler.owner-decision-retried',
    "decide 'owner': the one instance that decides a job fails to decide a tick (its transaction failed: a blip, a pool timeout under load) — it tries that tick again while it is younger than catchUpGraceMs, and the tick runs once, not lost (every-instance mode had the other instances for that)",
    () =>
      withSchema(async (schema) => {
        const jobs = jobNames(20);
        const clock = handClock();
        const membership = { heartbeatMs: 1000, expireMs: 5000 };
        const options = { now: clock.now, membership, catchUpGraceMs: 2000 };
        let failNext = false;
        const flaky = (executor: LockExecutor<Tx, Session>): LockExecutor<Tx, Session> => ({
          name: executor.name,
          transaction: (fn) => {
            if (!failNext) return executor.transaction(fn);
            failNext = false;
            return Promise.reject(new Error('a blip: this transaction never reached the server'));
          },
        });
        const a = node(schema, 'a', jobs, options, 'transaction', flaky);
        const b = node(schema, 'b', jobs, options);
        clock.set(0.5);
        for (const n of [a, b, a, b]) await n.scheduler.syncMembership();
        clock.set(1.5);
        await fireAll([a, b], jobs, at(1));
        // The job whose decision fails is whichever of a's starts its transaction first.
        let failedJob: string | undefined;
        const ran = new Set<string>();
        let onRan: (() => void) | undefined;
        a.scheduler.on('error', (e) => {
          failedJob = e.job;
        });
        a.scheduler.on('ran', (e) => {
          ran.add(`${e.job}@${e.tick.getTime()}`);
          onRan?.();
        });
        const ranAgain = new Promise<void>((resolve) => {
          onRan = () => {
            if (failedJob !== undefined && ran.has(`${failedJob}@${at(2).getTime()}`)) resolve();
          };
        });
        clock.set(2.5);
        failNext = true;
        await fireAll([a, b], jobs, at(2));
        expect(a.events.filter((e) => e.type === 'error').length).toBe(1);
        expect(failedJob !== undefined && a.scheduler.decides(failedJob)).toBe(true);
        onRan?.();
        // The retry is a real timer (this clock only reads): bounded, then judged.
        await Promise.race([
          ranAgain,
          new Promise((_, reject) =>
            setTimeout(
              () => reject(new Error('the failed decision was never tried again')),
              10_000,
            ),
          ),
        ]);
        await Promise.all([a.scheduler.stop(), b.scheduler.stop()]);
        await expectExactlyOnce(schema, jobs, [1, 2]);
      }),
    60_000,
  );

  test(
    'scheduler.owner-newcomer-during-death',
    "decide 'owner': an instance that joins after an owner died and never saw it live wins some of its jobs — the members that see the owner go take over those jobs' gap too, since the newcomer never sees it go",
    () =>
      withSchema(async (schema) => {
        // Enough jobs that the newcomer wins some of the dead owner's (each job about one chance
        // in four): none of 48 is about one chance in a million.
        const jobs = jobNames(48);
        const clock = handClock();
        const membership = { heartbeatMs: 1000, expireMs: 5000 };
        const options = { now: clock.now, membership, catchUpGraceMs: 2000 };
        const [a, b] = ['a', 'b'].map((name) => node(schema, name, jobs, options)) as [Node, Node];
        clock.set(0.5);
        for (const n of [a, b, a, b]) await n.scheduler.syncMembership();
        clock.set(1.5);
        await fireAll([a, b], jobs, at(1));
        // b's last heartbeat was at 0.5: killed. a sees it live until 5.5.
        const orphans = jobs.filter((job) => b.scheduler.decides(job));
        for (const s of [2, 3, 4, 5]) {
          clock.set(s + 0.4);
          await a.scheduler.syncMembership();
          await fireAll([a], jobs, at(s));
        }
        // c joins at 5.6: b is expired in its first view, so c never sees b, nor b go.
        clock.set(5.6);
        const c = node(schema, 'c', jobs, options);
        await c.scheduler.syncMembership();
        const wonByNewcomer = orphans.filter((job) => c.scheduler.decides(job));
        expect(wonByNewcomer.length).toBeGreaterThan(0);
        // a sees b go, with c in its new view: c's share of b's jobs is taken over by a too.
        clock.set(5.7);
        await a.scheduler.syncMembership();
        for (const s of [6, 7, 8]) {
          clock.set(s + 0.5);
          await a.scheduler.syncMembership();
          await c.scheduler.syncMembership();
          await fireAll([a, c], jobs, at(s));
        }
        await Promise.all([a, b, c].map((n) => n.scheduler.stop()));
        await expectExactlyOnce(schema, jobs, [1, 2, 3, 4, 5, 6, 7, 8]);
      }),
    60_000,
  );

  test(
    'scheduler.owner-tick-during-heartbeat',
    "decide 'owner': a tick due while the heartbeat that sees its owner gone is still in flight (the old view says the dead owner decides it) is run by the takeover, not lost",
    () =>
      withSchema(async (schema) => {
        const jobs = jobNames(20);
        const clock = handClock();
        // a's clock tells when a reads it: the heartbeat's own instant is the first read after arming.
        let onRead: (() => void) | undefined;
        const aNow = () => {
          const t = clock.now();
          const hook = onRead;
          onRead = undefined;
          hook?.();
          return t;
        };
        const membership = { heartbeatMs: 1000, expireMs: 5000 };
        const options = { membership, catchUpGraceMs: 2000 };
        const a = node(schema, 'a', jobs, { now: aNow, ...options });
        const b = node(schema, 'b', jobs, { now: clock.now, ...options });
        const beat = async (live: readonly Node[]) => {
          for (const n of live) await n.scheduler.syncMembership();
        };
        clock.set(0.5);
        await beat([a, b, a, b]);
        for (const s of [1, 2, 3]) {
          clock.set(s + 0.5);
          await beat([a, b]);
          await fireAll([a, b], jobs, at(s));
        }
        // b's last heartbeat was at 3.5: from now on it neither beats nor fires (killed).
        const orphans = jobs.filter((job) => b.scheduler.decides(job));
        expect(orphans.length).toBeGreaterThan(0);
        // a's heartbeats up to 8.4 still see b (gone once its heartbeat is expireMs old, at 8.5).
        for (const s of [4, 5, 6, 7, 8]) {
          clock.set(s + 0.4);
          await beat([a]);
          await fireAll([a], jobs, at(s));
        }
        expect(orphans.every((job) => !a.scheduler.decides(job))).toBe(true);
        // At 8.9 a's heartbeat goes out and will see b gone. Before its answer (a pool's backlog
        // delays it under load) tick 9 is due: a's timer fires it under the old view, where b
        // decides the orphans, so a skips them without a statement.
        clock.set(8.9);
        const read = new Promise<void>((resolve) => {
          onRead = resolve;
        });
        const sync = a.scheduler.syncMembership();
        await read;
        clock.set(9.05);
        await fireAll([a], jobs, at(9));
        expect(await sync).toEqual(['a']);
        expect(orphans.every((job) => a.scheduler.decides(job))).toBe(true);
        clock.set(10.5);
        await beat([a]);
        await fireAll([a], jobs, at(10));
        await a.scheduler.stop();
        await expectExactlyOnce(schema, jobs, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
        expect(a.events.filter((e) => e.type !== 'ran').map((e) => e.type)).toEqual([]);
        await b.scheduler.stop();
      }),
    60_000,
  );

  test(
    'scheduler.owner-heartbeat-commit-failed',
    "decide 'owner': a heartbeat that sees an owner gone but whose transaction fails at COMMIT does not forget that it is gone — the next heartbeat takes over its ticks",
    () =>
      withSchema(async (schema) => {
        const f = fixture();
        const jobs = jobNames(20);
        const clock = handClock();
        const membership = { heartbeatMs: 1000, expireMs: 5000 };
        const options = { now: clock.now, membership, catchUpGraceMs: 2000 };
        const [a, b] = ['a', 'b'].map((name) => node(schema, name, jobs, options)) as [Node, Node];
        clock.set(0.5);
        for (const n of [a, b, a, b]) await n.scheduler.syncMembership();
        clock.set(1.5);
        await fireAll([a, b], jobs, at(1));
        // b's last heartbeat was at 0.5: killed. a sees it gone from 5.5 on.
        const orphans = jobs.filter((job) => b.scheduler.decides(job));
        expect(orphans.length).toBeGreaterThan(0);
        for (const s of [2, 3, 4, 5]) {
          clock.set(s + 0.4);
          await a.scheduler.syncMembership();
          await fireAll([a], jobs, at(s));
        }
        // The heartbeat that sees b gone is answered, then its COMMIT fails (a deferred trigger).
        await f.observer.query(
          `CREATE FUNCTION "${schema}".refuse_commit() RETURNS trigger LANGUAGE plpgsql AS
             $$BEGIN RAISE EXCEPTION 'commit refused'; END$$`,
        );
        await f.observer.query(
          `CREATE CONSTRAINT TRIGGER refuse_commit AFTER INSERT OR UPDATE ON "${schema}".members
             DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION "${schema}".refuse_commit()`,
        );
        clock.set(5.6);
        try {
          await expect(a.scheduler.syncMembership()).rejects.toThrow();
        } finally {
          await f.observer.query(`DROP TRIGGER refuse_commit ON "${schema}".members`);
        }
        clock.set(5.7);
        expect(await a.scheduler.syncMembership()).toEqual(['a']);
        clock.set(6.5);
        await fireAll([a], jobs, at(6));
        await a.scheduler.stop();
        await expectExactlyOnce(schema, jobs, [1, 2, 3, 4, 5, 6]);
        await b.scheduler.stop();
      }),
    60_000,
  );

  test(
    'scheduler.owner-lease',
    "decide 'owner' in lease mode: each tick once under its lease, and a leaving owner's tick taken over",
    () =>
      withSchema(async (schema) => {
        const jobs = jobNames(20);
        const clock = handClock();
        const nodes = ['a', 'b'].map((name) =>
          node(schema, name, jobs, { now: clock.now }, 'lease'),
        );
        const [a, b] = nodes as [Node, Node];
        clock.set(0.5);
        for (const n of [...nodes, ...nodes]) await n.scheduler.syncMembership();
        for (const job of jobs) expect(deciders(nodes, job)).toHaveLength(1);
        for (const s of [1, 2]) {
          clock.set(s + 0.5);
          await fireAll(nodes, jobs, at(s));
        }
        const left = jobs.filter((job) => b.scheduler.decides(job));
        expect(left.length).toBeGreaterThan(0);
        await b.scheduler.stop();
        clock.set(3.5);
        await fireAll([a], jobs, at(3));
        await a.scheduler.syncMembership();
        clock.set(4.5);
        await fireAll([a], jobs, at(4));
        await a.scheduler.stop();
        await expectExactlyOnce(schema, jobs, [1, 2, 3, 4]);
        const tokens = await fixture().observer.query<{ n: number }>(
          `SELECT count(*)::int AS n FROM "${schema}".runs WHERE token IS NULL`,
        );
        expect(tokens[0]?.n, 'lease-mode rows carry their fencing token').toBe(0);
      }),
    60_000,
  );
}
