/**
 * The membership heartbeat against a real PostgreSQL: members see each other through one
 * statement a beat, agree on every job's owner, and see a member that left or died — judged by
 * the database's clock — so that its successors owe its jobs' ticks from its last beat.
 */
import { randomBytes } from 'node:crypto';
import { testDatabaseBaseUrl } from '@lockkit/test-db';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { migrate } from '../src/migrate.js';
import { type RunStatement, SchedulerMembership } from '../src/scheduler-membership.js';
import { quoteIdentifier } from '../src/sql/identifiers.js';
import { clientExecutor } from './client-executor.js';

const schemaName = `lockkit_members_${randomBytes(4).toString('hex')}`;
let admin: pg.Client;
let run: RunStatement;

beforeAll(async () => {
  admin = new pg.Client({ connectionString: testDatabaseBaseUrl() });
  await admin.connect();
  await migrate(clientExecutor(admin), { schema: schemaName });
  run = async (statement) =>
    (await admin.query(statement.text, [...(statement.params ?? [])])).rows as Record<
      string,
      unknown
    >[];
});
afterAll(async () => {
  await admin.query(`DROP SCHEMA IF EXISTS "${schemaName}" CASCADE`);
  await admin.end();
});

const jobs = Array.from({ length: 200 }, (_, i) => `job-${i}`);

/** Members of a fresh namespace, on one local clock the test moves. */
function namespace(
  names: readonly string[],
  settings = { heartbeatMs: 100, ttlMs: 400, staleMs: 300 },
) {
  const scope = { schema: quoteIdentifier(schemaName), namespace: randomBytes(4).toString('hex') };
  let now = 1_000_000;
  const members = names.map(
    (name) => new SchedulerMembership(run, scope, name, settings, () => now),
  );
  return {
    scope,
    members,
    advance: (ms: number) => {
      now += ms;
    },
    now: () => now,
    /** Two rounds: in the first, a member beats before the later ones have rows. */
    beatAll: async () => {
      for (let round = 0; round < 2; round++) for (const m of members) await m.beat();
    },
  };
}

/** Owners of every job in each member's view. */
const ownersIn = (members: readonly SchedulerMembership[]) =>
  members.map((m) => jobs.map((job) => m.view.owner(job)));

describe('scheduler membership (real PostgreSQL)', () => {
  it('members that beat see each other, agree on every owner, and each job is decided by one', async () => {
    const ns = namespace(['a', 'b', 'c']);
    await ns.beatAll();
    const [first, ...others] = ownersIn(ns.members);
    for (const view of others) expect(view).toEqual(first);
    const at = ns.now();
    for (const job of jobs) {
      expect(ns.members.filter((m) => m.view.decides(job, at)).length, job).toBe(1);
    }
    // Every member owns some of 200 jobs (rendezvous hashing spreads them).
    for (const name of ['a', 'b', 'c'])
      expect(first?.filter((o) => o === name).length).toBeGreaterThan(20);
    // No departure: nobody owes anything.
    for (const m of ns.members)
      for (const job of jobs) expect(m.view.owedFrom(job)).toBeUndefined();
  });

  it('a member that leaves hands its jobs on at the next beat, and its successors owe them from its leave', async () => {
    const ns = namespace(['a', 'b', 'c']);
    await ns.beatAll();
    const [a, b, c] = ns.members as [SchedulerMembership, SchedulerMembership, SchedulerMembership];
    const ofC = jobs.filter((job) => a.view.owner(job) === 'c');
    expect(ofC.length).toBeGreaterThan(0);
    const before = ns.now();
    await c.leave();
    // A beat after leaving does nothing: a stopped member does not come back.
    await c.beat();
    await a.beat();
    await b.beat();
    for (const job of ofC) {
      const owner = a.view.owner(job);
      expect(owner === 'a' || owner === 'b', job).toBe(true);
      expect(b.view.owner(job)).toBe(owner);
      const successor = owner === 'a' ? a : b;
      const owed = successor.view.owedFrom(job);
      // The leave's instant, on the members' clock: the local clock did not move, so it is close
      // to `before` (the database's clock moved on only by the statements' time).
      expect(owed, job).toBeDefined();
      expect(Math.abs((owed as number) - before)).toBeLessThan(5_000);
      // Paid once: not owed again for the same departure.
      expect(successor.view.owedFrom(job)).toBeUndefined();
    }
  });

  it('a leave written late (its statement held, as behind an exhausted pool) dates the departure at the stop: the successors owe the ticks since the stop, not since the write', async () => {
    const scope = {
      schema: quoteIdentifier(schemaName),
      namespace: randomBytes(4).toString('hex'),
    };
    const settings = { heartbeatMs: 1000, ttlMs: 60_000, staleMs: 50_000 };
    let release = () => {};
    const gate = new Promise<void>((resolve) => {
      release = resolve;
    });
    let leaveHeld = () => {};
    const held = new Promise<void>((resolve) => {
      leaveHeld = resolve;
    });
    // A's leave is held before it reaches the server until the test lets it go.
    const heldRun: RunStatement = async (statement) => {
      if (statement.text.startsWith('UPDATE')) {
        leaveHeld();
        await gate;
      }
      return run(statement);
    };
    // The members' clock is the wall clock, as a scheduler's is by default.
    const a = new SchedulerMembership(heldRun, scope, 'a', settings, Date.now);
    const b = new SchedulerMembership(run, scope, 'b', settings, Date.now);
    await a.beat();
    await b.beat();
    await a.beat();
    const ofA = jobs.filter((job) => b.view.owner(job) === 'a');
    expect(ofA.length).toBeGreaterThan(0);
    // A stops: leave() is called (it notes its stop at once); then both clocks are read.
    const leaving = a.leave();
    const stopLocal = Date.now();
    const [{ at: stopDb }] = (await admin.query('SELECT clock_timestamp() AS at')).rows as [
      { at: Date },
    ];
    await held;
    // The database's clock moves on while the leave waits (B beats meanwhile, A still live).
    await b.beat();
    await new Promise((resolve) => setTimeout(resolve, 20));
    release();
    await leaving;
    const { rows } = await admin.query<{ departed_at: Date; gone: boolean }>(
      `SELECT heartbeat_at AS departed_at, expires_at <= clock_timestamp() AS gone
         FROM "${schemaName}".scheduler_members WHERE namespace = $1 AND member = 'a'`,
      [scope.namespace],
    );
    const [left] = rows as [{ departed_at: Date; gone: boolean }];
    expect(left.gone).toBe(true);
    expect(
      left.departed_at.getTime(),
      'the departure is dated at the stop (database clock, ms)',
    ).toBeLessThanOrEqual(stopDb.getTime());
    // B owes A's jobs from the stop on (its own clock), not from when the leave got through.
    await b.beat();
    for (const job of ofA) {
      const owed = b.view.owedFrom(job);
      expect(owed, job).toBeDefined();
      expect(owed as number, job).toBeLessThanOrEqual(stopLocal);
    }
  });

  it('a member that dies is seen gone once its row expires by the database clock, and owed from its last beat', async () => {
    const ns = namespace(['a', 'b']);
    await ns.beatAll();
    const [a] = ns.members as [SchedulerMembership, SchedulerMembership];
    const ofB = jobs.filter((job) => a.view.owner(job) === 'b');
    // b stops beating (killed). Until its row expires, it still owns its jobs in a's view.
    await a.beat();
    for (const job of ofB) expect(a.view.owner(job)).toBe('b');
    const expired = await until(async () => {
      const { rows } = await admin.query(
        `SELECT expires_at < clock_timestamp() AS gone FROM "${schemaName}".scheduler_members WHERE namespace = $1 AND member = 'b'`,
        [ns.scope.namespace],
      );
      return rows[0]?.gone === true;
    });
    expect(expired).toBe(true);
    await a.beat();
    for (const job of ofB) {
      expect(a.view.owner(job)).toBe('a');
      expect(a.view.owedFrom(job)).toBeDefined();
    }
  });

  it('a member whose beats fail decides every job once its view is stale', async () => {
    const ns = namespace(['a', 'b']);
    await ns.beatAll();
    const [a] = ns.members as [SchedulerMembership, SchedulerMembership];
    const notA = jobs.filter((job) => !a.view.decides(job, ns.now()));
    expect(notA.length).toBeGreaterThan(0);
    ns.advance(299);
    expect(notA.some((job) => a.view.decides(job, ns.now()))).toBe(false);
    ns.advance(1);
    expect(notA.every((job) => a.view.decides(job, ns.now()))).toBe(true);
  });

  it('a leave marks the row departed, every time: no longer live, its departure at or before that instant and within a TTL of it', async () => {
    const ns = namespace([]);
    const settings = { heartbeatMs: 1000, ttlMs: 60_000, staleMs: 50_000 };
    // A departure is dated no later than the row stops being live (clock_timestamp() read twice
    // in one statement may differ by a microsecond, and once did, the wrong way round).
    for (let i = 0; i < 300; i++) {
      const m = new SchedulerMembership(run, ns.scope, `m-${i}`, settings, ns.now);
      await m.beat();
      await m.leave();
    }
    const { rows } = await admin.query(
      `SELECT count(*) FILTER (WHERE NOT (heartbeat_at <= expires_at
                                          AND expires_at < heartbeat_at + interval '60 s'))::int AS unmarked,
              count(*) FILTER (WHERE expires_at > clock_timestamp())::int AS live
         FROM "${schemaName}".scheduler_members WHERE namespace = $1`,
      [ns.scope.namespace],
    );
    expect(rows[0]).toEqual({ unmarked: 0, live: 0 });
  });

  for (const beforeLeave of ['its first beat', 'a later beat'] as const) {
    it(`a leave while ${beforeLeave} is in flight: the beat, answered after the leave was asked, does not bring the row back`, async () => {
      const ns = namespace([]);
      const settings = { heartbeatMs: 1000, ttlMs: 60_000, staleMs: 50_000 };
      let holding = false;
      let release = () => {};
      const gate = new Promise<void>((resolve) => {
        release = resolve;
      });
      let beatHeld = () => {};
      const held = new Promise<void>((resolve) => {
        beatHeld = resolve;
      });
      let leaveSent = false;
      // The beat's statement is held before it reaches the server; the leave's is noted when
      // sent (synchronously, within leave(), if it does not wait for the beat).
      const heldRun: RunStatement = async (statement) => {
        if (holding && statement.text.includes('WITH beat AS')) {
          holding = false;
          beatHeld();
          await gate;
        } else if (statement.text.startsWith('UPDATE')) leaveSent = true;
        return run(statement);
      };
      const m = new SchedulerMembership(heldRun, ns.scope, 'a', settings, ns.now);
      if (beforeLeave === 'a later beat') await m.beat();
      holding = true;
      const beat = m.beat().catch(() => {});
      await held;
      const leave = m.leave();
      // A leave sent at once is let through first (it commits before the beat is released);
      // one that waits for the beat has sent nothing yet.
      if (leaveSent) await leave;
      release();
      await Promise.all([beat, leave]);
      const { rows } = await admin.query(
        `SELECT expires_at <= clock_timestamp() AS gone,
                expires_at < heartbeat_at + interval '60 s' AS departed
           FROM "${schemaName}".scheduler_members WHERE namespace = $1 AND member = 'a'`,
        [ns.scope.namespace],
      );
      expect(rows).toEqual([{ gone: true, departed: true }]);
    });
  }

  it('refuses timings under which a member could be taken over while it still trusts its view', () => {
    const scope = { schema: quoteIdentifier(schemaName), namespace: 'x' };
    const membership = (heartbeatMs: number, ttlMs: number, staleMs: number) => () =>
      new SchedulerMembership(run, scope, 'a', { heartbeatMs, ttlMs, staleMs }, () => 0);
    // Stale no sooner than the row expires; a TTL of only two beats.
    expect(membership(100, 400, 400)).toThrow(RangeError);
    expect(membership(200, 400, 300)).toThrow(RangeError);
  });
});

/** Polls `check` (a database state, not a timing) until it holds, for at most 10 s. */
async function until(check: () => Promise<boolean>): Promise<boolean> {
  for (let i = 0; i < 200; i++) {
    if (await check()) return true;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  return false;
}
