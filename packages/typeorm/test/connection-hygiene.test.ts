/**
 * What the TypeORM executor gives back to the pool, and what it reports, when the task or TypeORM
 * itself leaves the connection in an unexpected state: a subscriber that throws inside
 * `startTransaction()`, a transaction level the task leaves open, a QueryRunner or pg client the
 * task releases itself, a DataSource destroyed mid-job, a pooled connection someone else left
 * inside a transaction. Each test checks from outside, with its own connection: whether the
 * task's writes committed, and whether an ordinary autocommit write through the DataSource
 * afterwards is kept (it is lost when the pooled connection went back "idle in transaction").
 * No timing windows: tasks are held on promises, and the queue is read from the pool's counters.
 */
import { randomBytes } from 'node:crypto';
import { isLockkitError, LockKey } from '@lockkit/core';
import { testDatabaseUrl } from '@lockkit/test-db';
import pg from 'pg';
import { DataSource, type QueryRunner } from 'typeorm';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { createLockKit } from '../src/index.js';

const schema = `typeorm_hygiene_${randomBytes(4).toString('hex')}`;
const table = `${schema}.writes`;
let outside: pg.Client;

beforeAll(async () => {
  outside = new pg.Client({ connectionString: testDatabaseUrl() });
  await outside.connect();
  await outside.query(`CREATE SCHEMA ${schema}; CREATE TABLE ${table} (what text NOT NULL)`);
});
afterAll(async () => {
  // A connection a failed test left mid-transaction must not hold the suite up.
  await outside.query(`SET lock_timeout = 5000; DROP SCHEMA ${schema} CASCADE`).catch(() => {});
  await outside.end();
});

const closers: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  await Promise.all(closers.splice(0).map((close) => close()));
});

const tag = (what: string) => `${what}-${randomBytes(6).toString('hex')}`;
const key = (what: string) => LockKey.fromNames('typeorm-hygiene', tag(what));

async function dataSource(poolSize: number) {
  const ds = new DataSource({ type: 'postgres', url: testDatabaseUrl(), poolSize });
  await ds.initialize();
  closers.push(async () => {
    if (ds.isInitialized) await ds.destroy();
  });
  return ds;
}

/** node-postgres's pool under the DataSource. */
const poolOf = (ds: DataSource) =>
  (ds.driver as unknown as { master: { waitingCount: number; totalCount: number } }).master;

/** The committed rows carrying `what`, read on the test's own connection. */
async function committed(what: string): Promise<number> {
  const { rows } = await outside.query(`SELECT count(*)::int AS n FROM ${table} WHERE what = $1`, [
    what,
  ]);
  return rows[0].n;
}

/** Advisory locks anyone holds on `k`, read on the test's own connection. */
async function holders(k: LockKey): Promise<number> {
  const { rows } = await outside.query(
    `SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND granted
       AND objid = $1::int8::oid`,
    [String(k.pgLocks.objid)],
  );
  return rows[0].n;
}

/** An autocommit write through the DataSource's pool is kept: its connection is not mid-transaction. */
async function expectPoolClean(ds: DataSource): Promise<void> {
  const what = tag('app-write');
  await ds.query(`INSERT INTO ${table} VALUES ($1)`, [what]);
  expect(await committed(what)).toBe(1);
}

/** A promise and the function that settles it. */
function gate() {
  let open!: () => void;
  const opened = new Promise<void>((resolve) => {
    open = resolve;
  });
  return { opened, open };
}

/** Resolves once `ready()` holds, checking after each turn of the event loop. */
async function until(ready: () => boolean): Promise<void> {
  while (!ready()) await new Promise((resolve) => setImmediate(resolve));
}

const codeOf = (error: unknown) => (isLockkitError(error) ? error.code : String(error));

/** A transaction subscriber on `ds` whose `hook` throws `message` the first time it runs. */
function throwOnce(
  ds: DataSource,
  hook: 'afterTransactionStart' | 'beforeTransactionCommit' | 'afterTransactionCommit',
  message: string,
): void {
  let armed = true;
  ds.subscribers.push({
    [hook]: () => {
      if (!armed) return;
      armed = false;
      throw new Error(message);
    },
  });
}

describe('the TypeORM executor never hands back a connection inside a transaction', () => {
  it('rolls back when an afterTransactionStart subscriber throws (START TRANSACTION was already sent)', async () => {
    const ds = await dataSource(1);
    throwOnce(ds, 'afterTransactionStart', 'subscriber failed');
    const locks = createLockKit(ds, { engineSelfTest: false });
    let ran = false;
    const error = await locks
      .runExclusiveJob('typeorm-hygiene', tag('after-start'), async () => {
        ran = true;
      })
      .catch((e: unknown) => e);
    expect(ran).toBe(false);
    expect((error as Error).message).toBe('subscriber failed');
    await expectPoolClean(ds);
  });

  it('rolls back when a beforeTransactionCommit subscriber throws: nothing commits', async () => {
    const ds = await dataSource(1);
    throwOnce(ds, 'beforeTransactionCommit', 'subscriber failed');
    const locks = createLockKit(ds, { engineSelfTest: false });
    const what = tag('before-commit');
    const error = await locks
      .runExclusiveJob('typeorm-hygiene', tag('before-commit'), async (manager) => {
        await manager.query(`INSERT INTO ${table} VALUES ($1)`, [what]);
      })
      .catch((e: unknown) => e);
    expect((error as Error).message).toBe('subscriber failed');
    expect(await committed(what)).toBe(0);
    await expectPoolClean(ds);
  });

  it('refuses to report success when the task leaves a TypeORM transaction level open: nothing commits, the lock is released', async () => {
    const ds = await dataSource(1);
    const locks = createLockKit(ds, { engineSelfTest: false });
    const job = tag('open-level');
    const what = tag('task-write');
    const error = await locks
      .runExclusiveJob('typeorm-hygiene', job, async (manager) => {
        // A helper that forgot its commitTransaction() on some path.
        await (manager.queryRunner as QueryRunner).startTransaction();
        await manager.query(`INSERT INTO ${table} VALUES ($1)`, [what]);
        return 'done';
      })
      .catch((e: unknown) => e);
    expect(codeOf(error)).toBe('COMMIT_ROLLED_BACK');
    expect(await committed(what)).toBe(0);
    await expectPoolClean(ds);
    // Another instance can take the job: the lock went with the rollback.
    const other = createLockKit(await dataSource(1), { engineSelfTest: false });
    expect(await other.runExclusiveJob('typeorm-hygiene', job, async () => 'ran')).toEqual({
      executed: true,
      result: 'ran',
    });
  });

  it('rolls the whole transaction back when the task throws with a TypeORM transaction level open', async () => {
    const ds = await dataSource(1);
    const locks = createLockKit(ds, { engineSelfTest: false });
    const job = tag('open-level-throw');
    const first = tag('first-run');
    const second = tag('second-run');
    const error = await locks
      .runExclusiveJob('typeorm-hygiene', job, async (manager) => {
        await manager.query(`INSERT INTO ${table} VALUES ($1)`, [first]);
        await (manager.queryRunner as QueryRunner).startTransaction();
        throw new Error('task failed');
      })
      .catch((e: unknown) => e);
    expect((error as Error).message).toBe('task failed');
    // The same job again, on the same (only) connection: its COMMIT commits its own write only.
    const again = await locks.runExclusiveJob('typeorm-hygiene', job, async (manager) => {
      await manager.query(`INSERT INTO ${table} VALUES ($1)`, [second]);
      return 'ran';
    });
    expect(again).toEqual({ executed: true, result: 'ran' });
    expect({ first: await committed(first), second: await committed(second) }).toEqual({
      first: 0,
      second: 1,
    });
    await expectPoolClean(ds);
  });

  it('refuses a pooled connection that another QueryRunner left inside a transaction, and closes it', async () => {
    const ds = await dataSource(1);
    const stray = tag('stray-write');
    const runner = ds.createQueryRunner();
    await runner.startTransaction();
    await runner.query(`INSERT INTO ${table} VALUES ($1)`, [stray]);
    // Released without COMMIT or ROLLBACK: the pool takes the connection back as it is.
    await runner.release();
    const locks = createLockKit(ds, { engineSelfTest: false });
    let ran = false;
    const error = await locks
      .runExclusiveJob('typeorm-hygiene', tag('handed-over'), async () => {
        ran = true;
      })
      .catch((e: unknown) => e);
    expect(ran).toBe(false);
    expect(codeOf(error)).toBe('CONNECTION_LOST');
    expect(String((error as Error).message)).toMatch(/inside a transaction/);
    expect(await committed(stray)).toBe(0);
    // The pool replaced the closed connection.
    expect(await locks.runExclusiveJob('typeorm-hygiene', tag('after'), async () => 'ran')).toEqual(
      { executed: true, result: 'ran' },
    );
    await expectPoolClean(ds);
  });

  it("dataSource.destroy() during a job: the job's connection is closed (its task told), never handed to a queued caller of the same job", async () => {
    const ds = await dataSource(1);
    const locks = createLockKit(ds, { engineSelfTest: false });
    const job = tag('destroy');
    const partial = tag('a-partial');
    const bWrite = tag('b-write');
    const aWrote = gate();
    const aGo = gate();
    let aInside = false;
    let aSignal: AbortSignal | undefined;
    // B inside the job while A is inside too, and A not told that its lock is gone.
    let overlap = false;
    const a = locks
      .runExclusiveJob('typeorm-hygiene', job, async (manager, ctx) => {
        aInside = true;
        aSignal = ctx.signal;
        await manager.query(`INSERT INTO ${table} VALUES ($1)`, [partial]);
        aWrote.open();
        await aGo.opened;
        aInside = false;
        return 'a';
      })
      .catch((e: unknown) => e);
    await aWrote.opened;
    const b = locks
      .runExclusiveJob('typeorm-hygiene', job, async (manager) => {
        overlap = aInside && aSignal?.aborted !== true;
        await manager.query(`INSERT INTO ${table} VALUES ($1)`, [bWrite]);
        return 'b';
      })
      .catch((e: unknown) => e);
    // B waits for the only connection.
    await until(() => poolOf(ds).waitingCount === 1);
    await ds.destroy();
    aGo.open();
    const [aOutcome] = await Promise.all([a, b]);
    expect(overlap).toBe(false);
    expect(codeOf(aOutcome)).toBe('CONNECTION_LOST');
    expect(await committed(partial)).toBe(0);
  });
  it('dataSource.destroy() with a pool of two, both connections in jobs and a caller queued: every call settles with a lockkit error or a true result', async () => {
    const ds = await dataSource(2);
    const locks = createLockKit(ds, { engineSelfTest: false });
    const job = tag('destroy-pool');
    const partial = tag('a-partial');
    const started = [gate(), gate()];
    const go = gate();
    const signals: AbortSignal[] = [];
    const holder = (i: number) =>
      locks
        .runExclusiveJob('typeorm-hygiene', i === 0 ? job : tag('filler'), async (manager, ctx) => {
          signals.push(ctx.signal);
          if (i === 0) await manager.query(`INSERT INTO ${table} VALUES ($1)`, [partial]);
          started[i]?.open();
          await go.opened;
          return i;
        })
        .catch((e: unknown) => e);
    const holders = [holder(0), holder(1)];
    await Promise.all(started.map((g) => g.opened));
    let overlap = false;
    const b = locks
      .runExclusiveJob('typeorm-hygiene', job, async () => {
        overlap = signals.some((signal) => !signal.aborted);
        return 'b';
      })
      .catch((e: unknown) => e);
    await until(() => poolOf(ds).waitingCount === 1);
    await ds.destroy();
    go.open();
    const outcomes = await Promise.all([...holders, b]);
    expect(outcomes.slice(0, 2).map(codeOf)).toEqual(['CONNECTION_LOST', 'CONNECTION_LOST']);
    const last = outcomes[2];
    // B may be the one destroy() cuts off, before its COMMIT or during it.
    if (isLockkitError(last))
      expect(['CONNECTION_LOST', 'COMMIT_OUTCOME_UNKNOWN']).toContain(last.code);
    else expect(last).toMatchObject({ executed: expect.any(Boolean) });
    expect(overlap).toBe(false);
    expect(await committed(partial)).toBe(0);
  });
});

describe('the TypeORM executor when the task releases what lockkit holds', () => {
  it('transaction scope, manager.queryRunner.release(): the transaction dies with its connection, the call rejects, the lock does not linger in the pool', async () => {
    const ds = await dataSource(2);
    const locks = createLockKit(ds, { engineSelfTest: false });
    const k = key('tx-release');
    const what = tag('released-write');
    const error = await locks
      .withLock(k, async (manager) => {
        await manager.query(`INSERT INTO ${table} VALUES ($1)`, [what]);
        await (manager.queryRunner as QueryRunner).release();
        return 'x';
      })
      .catch((e: unknown) => e);
    expect(codeOf(error)).toBe('CONNECTION_LOST');
    expect(await committed(what)).toBe(0);
    expect(await holders(k)).toBe(0);
    await expectPoolClean(ds);
    await expectPoolClean(ds);
  });

  it('transaction scope, the raw pg client released by the task: nothing commits, the call rejects CONNECTION_LOST', async () => {
    const ds = await dataSource(2);
    const locks = createLockKit(ds, { engineSelfTest: false });
    const what = tag('raw-release');
    const error = await locks
      .runExclusiveJob('typeorm-hygiene', tag('raw'), async (manager) => {
        const client = (await (manager.queryRunner as QueryRunner).connect()) as pg.PoolClient;
        await manager.query(`INSERT INTO ${table} VALUES ($1)`, [what]);
        client.release();
        return 'x';
      })
      .catch((e: unknown) => e);
    expect(codeOf(error)).toBe('CONNECTION_LOST');
    expect(await committed(what)).toBe(0);
    await expectPoolClean(ds);
  });

  it('session scope, runner.release(): the session lock ends with its connection (the task is told), and no other caller re-enters it on that connection', async () => {
    const ds = await dataSource(2);
    const locks = createLockKit(ds, { engineSelfTest: false });
    const k = key('session-release');
    const released = gate();
    const aGo = gate();
    let aSignalAfterRelease: boolean | undefined;
    let aPid: number | undefined;
    const a = locks
      .withSessionLock(k, async (runner, ctx) => {
        aPid = (await runner.query('SELECT pg_backend_pid() AS pid'))[0].pid;
        await runner.release();
        aSignalAfterRelease = ctx.signal.aborted;
        released.open();
        await aGo.opened;
        return 'a';
      })
      .catch((e: unknown) => e);
    await released.opened;
    const b = await locks.withSessionLock(
      k,
      async (runner) => (await runner.query('SELECT pg_backend_pid() AS pid'))[0].pid as number,
    );
    aGo.open();
    expect(aSignalAfterRelease).toBe(true);
    expect(codeOf(await a)).toBe('CONNECTION_LOST');
    // B may or may not have got the lock; if it did, it was on another backend (A's was closed).
    if (b.executed) expect(b.result).not.toBe(aPid);
    expect(await holders(k)).toBe(0);
    expect(poolOf(ds).totalCount).toBeLessThanOrEqual(2);
  });
});

describe('the TypeORM executor when work committed and something after it failed', () => {
  it('an afterTransactionCommit subscriber that throws: the call rejects AFTER_COMMIT_FAILED, saying the work committed', async () => {
    const ds = await dataSource(1);
    throwOnce(ds, 'afterTransactionCommit', 'afterTransactionCommit subscriber failed');
    const outcomes: string[] = [];
    const locks = createLockKit(ds, {
      engineSelfTest: false,
      onEvent: (event) => {
        if (event.type === 'lock-released') outcomes.push(event.outcome);
      },
    });
    const what = tag('committed-write');
    const error = await locks
      .runExclusiveJob('typeorm-hygiene', tag('after-commit'), async (manager) => {
        await manager.query(`INSERT INTO ${table} VALUES ($1)`, [what]);
        return 'done';
      })
      .catch((e: unknown) => e);
    expect(codeOf(error)).toBe('AFTER_COMMIT_FAILED');
    expect(String((error as Error).message)).toMatch(/committed/);
    expect(((error as Error).cause as Error).message).toBe(
      'afterTransactionCommit subscriber failed',
    );
    expect(await committed(what)).toBe(1);
    expect(outcomes).toEqual(['committed']);
    await expectPoolClean(ds);
  });
});
