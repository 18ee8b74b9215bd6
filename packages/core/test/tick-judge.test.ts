/**
 * The overlap judgement's statement (issue 24) against a real server: what a node whose wait for
 * the job's lock timed out concludes from each state another transaction can be in — the states a
 * runner passes through (the job's lock alone, then with its tick's lock), the state a dying
 * runner can leave for an instant (the job's lock alone, its tick lock already freed), and a run
 * of another tick. Only the last is an overlap.
 */
import { randomBytes } from 'node:crypto';
import { testDatabaseUrl } from '@lockkit/test-db';
import pg from 'pg';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { LockKey } from '../src/keys.js';
import { tickJudgeStatement } from '../src/sql/scheduler.js';

let runner: pg.Client;
let bystander: pg.Client;
let judge: pg.Client;

beforeAll(async () => {
  const connect = async () => {
    const client = new pg.Client({ connectionString: testDatabaseUrl() });
    await client.connect();
    return client;
  };
  [runner, bystander, judge] = await Promise.all([connect(), connect(), connect()]);
});

afterAll(async () => {
  await Promise.all([runner.end(), bystander.end(), judge.end()]);
});

afterEach(async () => {
  await Promise.all([runner.query('ROLLBACK'), bystander.query('ROLLBACK')]);
});

/** Keys built as the scheduler builds them: the job's, and its ticks' in `<namespace>#tick`. */
function keys() {
  const namespace = `judge-${randomBytes(6).toString('hex')}`;
  return {
    job: LockKey.fromNames(namespace, 'job'),
    tick: LockKey.fromNames(`${namespace}#tick`, 'hash@2031-01-01T00:00:01.000Z'),
    earlierTick: LockKey.fromNames(`${namespace}#tick`, 'hash@2031-01-01T00:00:00.000Z'),
  };
}

/** Takes `held` in a transaction of `client` (left open). */
async function hold(client: pg.Client, ...held: LockKey[]): Promise<void> {
  await client.query('BEGIN');
  for (const key of held) {
    const [k1, k2] = key.pair ?? [0, 0];
    await client.query('SELECT pg_advisory_xact_lock($1::int4, $2::int4)', [k1, k2]);
  }
}

/** The judgement, in a transaction rolled back afterwards. */
async function judgement(job: LockKey, tick: LockKey) {
  const s = tickJudgeStatement(job, tick);
  await judge.query('BEGIN');
  try {
    const { rows } = await judge.query(s.text, s.params as unknown[]);
    return rows[0] as { tick_free: boolean | null; another_tick_runs: boolean | null };
  } finally {
    await judge.query('ROLLBACK');
  }
}

describe('the overlap judgement (tickJudgeStatement)', () => {
  it("a runner of this tick holding the job's lock alone — between its two statements, or dying — is no proof of an overlap", async () => {
    const k = keys();
    await hold(runner, k.job);
    expect(await judgement(k.job, k.tick)).toMatchObject({
      tick_free: true,
      another_tick_runs: false,
    });
  });

  it("a runner holding the job's lock and this tick's: the tick's lock is not free (wait for its outcome)", async () => {
    const k = keys();
    await hold(runner, k.job, k.tick);
    expect(await judgement(k.job, k.tick)).toMatchObject({
      tick_free: false,
      another_tick_runs: null,
    });
  });

  it("a transaction holding the job's lock and another tick's lock is a run of another tick: an overlap", async () => {
    const k = keys();
    await hold(runner, k.job, k.earlierTick);
    expect(await judgement(k.job, k.tick)).toMatchObject({
      tick_free: true,
      another_tick_runs: true,
    });
  });

  it('the proof is one transaction holding both: a tick lock held elsewhere does not count', async () => {
    const k = keys();
    await hold(runner, k.job);
    await hold(bystander, k.earlierTick);
    expect(await judgement(k.job, k.tick)).toMatchObject({
      tick_free: true,
      another_tick_runs: false,
    });
  });

  it("a free job lock is no overlap, and the judge never takes the job's lock", async () => {
    const k = keys();
    expect(await judgement(k.job, k.tick)).toMatchObject({
      tick_free: true,
      another_tick_runs: false,
    });
    // The judge holds the tick's lock while it records, never the job's: a runner gets the job.
    const s = tickJudgeStatement(k.job, k.tick);
    await judge.query('BEGIN');
    try {
      await judge.query(s.text, s.params as unknown[]);
      await runner.query('BEGIN');
      const [j1, j2] = k.job.pair ?? [0, 0];
      const { rows } = await runner.query(
        'SELECT pg_try_advisory_xact_lock($1::int4, $2::int4) AS got',
        [j1, j2],
      );
      expect(rows[0]?.got).toBe(true);
      const [t1, t2] = k.tick.pair ?? [0, 0];
      const tick = await runner.query(
        'SELECT pg_try_advisory_xact_lock($1::int4, $2::int4) AS got',
        [t1, t2],
      );
      expect(tick.rows[0]?.got).toBe(false);
    } finally {
      await judge.query('ROLLBACK');
    }
  });
});
