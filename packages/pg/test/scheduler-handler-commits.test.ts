/**
 * A transaction-mode scheduler handler that ends the tick's transaction itself (its own COMMIT):
 * its work and the tick's claim committed there, and the job's lock went with them. The scheduler
 * must tell that truth — `LOCK_NOT_HELD`, as withLock does for the same misuse (docs/errors.md) —
 * not `COMMIT_ROLLED_BACK` ("none of its work can commit"), and must not leave the tick RUNNING
 * for good with no runner: it is recorded FAILED with that error (its work may be committed, so it
 * is not retried). Found by an outside review (attack2).
 */
import { randomBytes } from 'node:crypto';
import { createScheduler, type Scheduler, SimulatedClock } from '@lockkit/core';
import { createLockKit } from '@lockkit/pg';
import { testDatabaseUrl } from '@lockkit/test-db';
import pg from 'pg';
import { expect, it } from 'vitest';

const BASE = Date.UTC(2031, 0, 1, 0, 0, 0);

/**
 * Runs `fn` on a fresh schema name with an admin client; afterwards, whatever happened, drops the
 * schema and ends the client and `pools`.
 */
async function withSchema(
  pools: readonly pg.Pool[],
  fn: (schema: string, admin: pg.Client) => Promise<void>,
): Promise<void> {
  const schema = `attack_hc_${randomBytes(4).toString('hex')}`;
  const admin = new pg.Client({ connectionString: testDatabaseUrl() });
  await admin.connect();
  try {
    await fn(schema, admin);
  } finally {
    await admin.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
    await admin.end();
    for (const pool of pools) await pool.end();
  }
}

/** Records a scheduler's ran, failed, error and skipped-done events as `type:code`. */
function recordEvents(s: Scheduler<pg.PoolClient>, events: string[]): void {
  for (const type of ['ran', 'failed', 'error', 'skipped-done'] as const)
    s.on(type, (e: unknown) => {
      const code = (e as { error?: { code?: string } }).error?.code;
      events.push(`${type}:${code ?? ''}`);
    });
}

/**
 * One node on a fresh schema (with a `work` table), its clock at BASE + 10 ms, its ran, failed,
 * error and skipped-done events recorded: `fn` registers the job and drives it; the node is
 * stopped afterwards.
 */
async function oneNode(
  fn: (t: {
    s: Scheduler<pg.PoolClient>;
    schema: string;
    admin: pg.Client;
    events: string[];
  }) => Promise<void>,
): Promise<void> {
  const pool = new pg.Pool({ connectionString: testDatabaseUrl(), max: 3 });
  await withSchema([pool], async (schema, admin) => {
    const locks = createLockKit(pool, { schema });
    await locks.migrate();
    await admin.query(`CREATE TABLE "${schema}".work (tick timestamptz)`);
    const s = createScheduler(locks, { namespace: schema, clock: new SimulatedClock(BASE + 10) });
    const events: string[] = [];
    recordEvents(s, events);
    try {
      await fn({ s, schema, admin, events });
    } finally {
      await s.stop();
    }
  });
}

it('a handler that COMMITs the tick transaction itself: error LOCK_NOT_HELD, the tick recorded FAILED, its work kept', async () => {
  const pool = new pg.Pool({ connectionString: testDatabaseUrl(), max: 3 });
  await withSchema([pool], async (schema, admin) => {
    const locks = createLockKit(pool, { schema });
    await locks.migrate();
    await admin.query(`CREATE TABLE "${schema}".work (tick timestamptz)`);
    const events: string[] = [];
    const s = createScheduler(locks, { namespace: schema, now: () => BASE + 10 });
    recordEvents(s, events);
    s.register('job', '* * * * * *', async (run) => {
      await run.query(`INSERT INTO "${schema}".work VALUES ($1)`, [run.tick]);
      await run.query('COMMIT');
    });
    await s.runTick('job', new Date(BASE));
    // A late node fires the same tick (its clock behind), and then the next tick fires.
    await s.runTick('job', new Date(BASE));
    const work = (await admin.query(`SELECT count(*)::int AS n FROM "${schema}".work`)).rows[0].n;
    const ledger = (await admin.query(`SELECT status, error FROM "${schema}".runs`)).rows;
    const held = (
      await admin.query(`SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory'
        AND pid IN (SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid())`)
    ).rows[0].n;
    await s.stop();
    // The handler's INSERT committed (its own COMMIT), once: the late firing finds the tick done.
    expect(work).toBe(1);
    expect(events).toEqual(['error:LOCK_NOT_HELD', 'skipped-done:']);
    expect(ledger.map((r) => r.status)).toEqual(['FAILED']);
    expect(String(ledger[0]?.error)).toContain('LockNotHeldError');
    expect(held).toBe(0);
  });
});

/**
 * A pool that refuses its next `n` connections once `refuseNext(n)` is called: the database
 * unreachable for a moment, exactly when the scheduler records the handler's misuse in a
 * transaction of its own. `refused()`: how many it refused.
 */
function blippingPool(): { pool: pg.Pool; refuseNext: (n: number) => void; refused: () => number } {
  const pool = new pg.Pool({ connectionString: testDatabaseUrl(), max: 3 });
  let armed = 0;
  let refused = 0;
  const connect = pool.connect.bind(pool) as () => Promise<pg.PoolClient>;
  pool.connect = (() => {
    if (armed === 0) return connect();
    armed--;
    refused++;
    return Promise.reject(
      Object.assign(new Error('connect ECONNREFUSED (test blip)'), { code: 'ECONNREFUSED' }),
    );
  }) as typeof pool.connect;
  return {
    pool,
    refuseNext: (n) => {
      armed = n;
    },
    refused: () => refused,
  };
}

/**
 * One scheduler whose job's handler writes one row, COMMITs the tick's transaction itself, then
 * makes the pool refuse its next `blip` connections: the first is the one the scheduler's FAILED
 * record asks for.
 */
async function selfCommitWithBlip(
  blip: number,
  check: (t: {
    s: Scheduler<pg.PoolClient>;
    clock: SimulatedClock;
    state: () => Promise<{ statuses: string[]; errors: string[]; work: number; calls: number }>;
    refused: () => number;
    events: string[];
    schema: string;
  }) => Promise<void>,
): Promise<void> {
  const { pool, refuseNext, refused } = blippingPool();
  await withSchema([pool], async (schema, admin) => {
    const locks = createLockKit(pool, { schema });
    await locks.migrate();
    await admin.query(`CREATE TABLE "${schema}".work (tick timestamptz)`);
    const clock = new SimulatedClock(BASE + 10);
    const s = createScheduler(locks, { namespace: schema, clock });
    const events: string[] = [];
    recordEvents(s, events);
    let calls = 0;
    s.register(
      'job',
      '* * * * * *',
      async (run) => {
        calls++;
        await run.query(`INSERT INTO "${schema}".work VALUES ($1)`, [run.tick]);
        await run.query('COMMIT');
        refuseNext(blip);
      },
      { retryDelayMs: 1000 },
    );
    const state = async () => {
      const ledger = (await admin.query(`SELECT status, error FROM "${schema}".runs`)).rows;
      const work = (await admin.query(`SELECT count(*)::int AS n FROM "${schema}".work`)).rows[0]
        .n as number;
      return {
        statuses: ledger.map((r) => String(r.status)),
        errors: ledger.map((r) => String(r.error)),
        work,
        calls,
      };
    };
    try {
      await check({ s, clock, state, refused, events, schema });
    } finally {
      await s.stop();
    }
  });
}

/** Polls `read` until `done` holds of it, at most 10 s: what it read last. */
async function until<T>(read: () => Promise<T>, done: (value: T) => boolean): Promise<T> {
  let value = await read();
  for (let i = 0; i < 400 && !done(value); i++) {
    await new Promise((r) => setTimeout(r, 25));
    value = await read();
  }
  return value;
}

it('a handler that COMMITs itself, its FAILED record lost to a blip: a late node deciding the tick records it, never runs it again', async () => {
  await selfCommitWithBlip(1, async (t) => {
    await t.s.runTick('job', new Date(BASE));
    // The blip hit the scheduler's own FAILED write.
    expect(t.refused()).toBe(1);
    expect(t.events).toEqual(['error:LOCK_NOT_HELD']);
    // A late node fires the same tick (its clock never moved: the write's own retry waits).
    await t.s.runTick('job', new Date(BASE));
    const after = await t.state();
    expect(after.statuses).toEqual(['FAILED']);
    expect(after.errors[0]).toContain('LockNotHeldError');
    expect(after.work).toBe(1);
    expect(after.calls).toBe(1);
  });
});

it('a handler that COMMITs itself, its FAILED record lost to a longer outage, no other node: its own node writes it later, backing off', async () => {
  await selfCommitWithBlip(2, async (t) => {
    await t.s.runTick('job', new Date(BASE));
    expect(t.refused()).toBe(1);
    // The moment the bug lived in: RUNNING, with no runner.
    expect((await t.state()).statuses).toEqual(['RUNNING']);
    // After the job's retry delay the write is tried again, and refused again...
    await t.clock.advance(1000);
    expect(
      await until(
        async () => t.refused(),
        (n) => n === 2,
      ),
    ).toBe(2);
    expect((await t.state()).statuses).toEqual(['RUNNING']);
    // ...then after twice that delay, written.
    await t.clock.advance(2000);
    const after = await until(t.state, (v) => v.statuses[0] !== 'RUNNING');
    expect(after.statuses).toEqual(['FAILED']);
    expect(after.errors[0]).toContain('LockNotHeldError');
    expect(after.work).toBe(1);
    expect(after.calls).toBe(1);
  });
});

it('a handler that COMMITs itself and then throws: LOCK_NOT_HELD, the tick recorded FAILED (not a raw 25P01, not RUNNING for ever)', async () => {
  await oneNode(async ({ s, schema, admin, events }) => {
    s.register('job', '* * * * * *', async (run) => {
      await run.query('COMMIT');
      throw new Error('a later step of the handler failed');
    });
    await s.runTick('job', new Date(BASE));
    await s.stop();
    const ledger = (await admin.query(`SELECT status, error FROM "${schema}".runs`)).rows;
    expect(events).toEqual(['error:LOCK_NOT_HELD']);
    expect(ledger.map((r) => r.status)).toEqual(['FAILED']);
    expect(String(ledger[0]?.error)).toContain('LockNotHeldError');
  });
});

it("a transaction-mode node's late FAILED record never rewrites a lease-mode run of the same tick", async () => {
  const a = blippingPool();
  const poolB = new pg.Pool({ connectionString: testDatabaseUrl(), max: 4 });
  await withSchema([poolB, a.pool], async (schema, admin) => {
    await createLockKit(a.pool, { schema }).migrate();
    const clockA = new SimulatedClock(BASE + 10);
    // Node A runs the job in transaction mode; its handler ROLLBACKs the tick's transaction
    // itself (no row), and the FAILED record that follows meets a blip: written again later.
    const sA = createScheduler(createLockKit(a.pool, { schema }), {
      namespace: schema,
      clock: clockA,
    });
    sA.register(
      'job',
      '* * * * * *',
      async (run) => {
        await run.query('ROLLBACK');
        a.refuseNext(1);
      },
      { retryDelayMs: 1000 },
    );
    // Node B (mid-deploy: the job switched to lease mode) runs the same tick meanwhile.
    const sB = createScheduler(createLockKit(poolB, { schema }), {
      namespace: schema,
      now: () => BASE + 10,
    });
    let release!: () => void;
    const gate = new Promise<void>((r) => {
      release = r;
    });
    let started!: () => void;
    const inB = new Promise<void>((r) => {
      started = r;
    });
    const bEvents: string[] = [];
    sB.on('ran', () => bEvents.push('ran'));
    sB.register(
      'job',
      '* * * * * *',
      async () => {
        started();
        await gate;
      },
      { mode: 'lease' },
    );
    try {
      await sA.runTick('job', new Date(BASE));
      expect(a.refused()).toBe(1);
      const bWork = sB.runTick('job', new Date(BASE));
      await inB;
      // A's late write comes while B's run holds the tick (RUNNING under B's token).
      // The late write's transaction is over when its connection goes back to A's pool (nothing
      // else of A's uses it now: A was never started).
      const written = new Promise<void>((resolve) => a.pool.once('release', () => resolve()));
      await clockA.advance(1000);
      await written;
      const mid = (await admin.query(`SELECT status FROM "${schema}".runs`)).rows;
      release();
      await bWork;
      const after = (await admin.query(`SELECT status FROM "${schema}".runs`)).rows;
      expect(mid.map((r) => r.status)).toEqual(['RUNNING']);
      expect(after.map((r) => r.status)).toEqual(['SUCCEEDED']);
      expect(bEvents).toEqual(['ran']);
    } finally {
      release();
      await sA.stop();
      await sB.stop();
    }
  });
});

// The deploy's SIGTERM lands while the handler runs, after its own COMMIT: the run's signal aborts
// while its work is committed. The handler returns, or throws on the signal.
it.each([
  ['returns', false],
  ['throws on the stop signal', true],
] as const)(
  'a handler that COMMITs itself and %s while stop() is called: LOCK_NOT_HELD, the tick recorded FAILED (not given back, not left RUNNING with no runner)',
  async (_how, throws) => {
    await oneNode(async ({ s, schema, admin, events }) => {
      let stopped: Promise<unknown> | undefined;
      s.register('job', '* * * * * *', async (run) => {
        await run.query(`INSERT INTO "${schema}".work VALUES ($1)`, [run.tick]);
        await run.query('COMMIT');
        stopped = s.stop();
        if (throws) run.signal.throwIfAborted();
      });
      await s.runTick('job', new Date(BASE));
      await stopped;
      const ledger = (await admin.query(`SELECT status, error FROM "${schema}".runs`)).rows;
      const work = (await admin.query(`SELECT count(*)::int AS n FROM "${schema}".work`)).rows[0].n;
      expect(work).toBe(1);
      expect(ledger.map((r) => r.status)).toEqual(['FAILED']);
      expect(String(ledger[0]?.error)).toContain('LockNotHeldError');
      expect(events).toEqual(['error:LOCK_NOT_HELD']);
    });
  },
);

/**
 * Node B, on the same schema and namespace, its clock `laterMs` after BASE: fires the job's tick
 * at that time, as its timer would (catch-up reads the ticks before it). What its handler ran.
 */
async function laterNode(schema: string, laterMs: number): Promise<Date[]> {
  const pool = new pg.Pool({ connectionString: testDatabaseUrl(), max: 3 });
  const ran: Date[] = [];
  const s = createScheduler(createLockKit(pool, { schema }), {
    namespace: schema,
    clock: new SimulatedClock(BASE + laterMs + 10),
  });
  s.register('job', '* * * * * *', (run) => {
    ran.push(run.tick);
  });
  try {
    await s.runTick('job', new Date(BASE + laterMs));
  } finally {
    await s.stop();
    await pool.end();
  }
  return ran;
}

/**
 * What a node SIGKILLed between the handler's COMMIT and its FAILED record leaves too: a committed
 * RUNNING row with no fencing token and nobody to record it. Catch-up, which reads the job's latest
 * rows at its next timer tick on any node, records it.
 */
it('a handler that COMMITs itself, its FAILED record lost to an outage and its node stopped before writing it again: the next node to fire the job records it', async () => {
  await selfCommitWithBlip(2, async (t) => {
    await t.s.runTick('job', new Date(BASE));
    expect(t.refused()).toBe(1);
    await t.s.stop();
    expect((await t.state()).statuses).toEqual(['RUNNING']);
    const ran = await laterNode(t.schema, 5000);
    const after = await t.state();
    expect(after.statuses.sort()).toEqual(['FAILED', 'MISSED', 'MISSED', 'MISSED', 'SUCCEEDED']);
    expect(after.errors.filter((e) => e.includes('LockNotHeldError'))).toHaveLength(1);
    expect(after.work).toBe(1);
    expect(after.calls).toBe(1);
    expect(ran).toEqual([new Date(BASE + 5000)]);
  });
});

it("a node repairing another's self-committed tick does not hold that row through its own run: the first node's FAILED write is not blocked by the second node's long handler", async () => {
  const poolA = new pg.Pool({ connectionString: testDatabaseUrl(), max: 3 });
  const poolB = new pg.Pool({ connectionString: testDatabaseUrl(), max: 3 });
  await withSchema([poolA, poolB], async (schema, admin) => {
    await createLockKit(poolA, { schema }).migrate();
    const open = () => {
      let release!: () => void;
      const opened = new Promise<void>((r) => {
        release = r;
      });
      return { opened, release };
    };
    const aCommitted = open();
    const aGo = open();
    const bRunning = open();
    const bGo = open();
    // Node A's handler COMMITs the tick's transaction itself and goes on working, past the grace.
    const a = createScheduler(createLockKit(poolA, { schema }), {
      namespace: schema,
      clock: new SimulatedClock(BASE + 10),
    });
    const aEvents: string[] = [];
    recordEvents(a, aEvents);
    a.register('job', '* * * * * *', async (run) => {
      await run.query('COMMIT');
      aCommitted.release();
      await aGo.opened;
    });
    // Node B fires a later tick (its catch-up reads A's committed RUNNING row) and runs long.
    const b = createScheduler(createLockKit(poolB, { schema }), {
      namespace: schema,
      clock: new SimulatedClock(BASE + 5010),
    });
    b.register('job', '* * * * * *', async () => {
      bRunning.release();
      await bGo.opened;
    });
    try {
      const aWork = a.runTick('job', new Date(BASE));
      await aCommitted.opened;
      const bWork = b.runTick('job', new Date(BASE + 5000));
      await bRunning.opened;
      aGo.release();
      // A now records its tick FAILED from its own connection. Either that transaction ends
      // (A's runTick settles), or A's backend is seen waiting for a row lock (B's transaction
      // holding the row it repaired): whichever comes first, while B's handler still runs.
      const waitingOnLock = async (): Promise<'blocked'> => {
        for (;;) {
          const { rows } = await admin.query(
            `SELECT count(*)::int AS n FROM pg_stat_activity
              WHERE wait_event_type = 'Lock' AND datname = current_database()
                AND query ILIKE $1`,
            [`%"${schema}".runs%`],
          );
          if (rows[0].n > 0) return 'blocked';
          await new Promise((r) => setTimeout(r, 20));
        }
      };
      const first = await Promise.race([aWork.then(() => 'settled' as const), waitingOnLock()]);
      bGo.release();
      await Promise.all([aWork, bWork]);
      expect(first).toBe('settled');
      const row = (
        await admin.query(`SELECT status, error FROM "${schema}".runs WHERE tick = $1`, [
          new Date(BASE),
        ])
      ).rows;
      expect(row.map((r) => r.status)).toEqual(['FAILED']);
      expect(aEvents).toEqual(['error:LOCK_NOT_HELD']);
    } finally {
      aGo.release();
      bGo.release();
      await a.stop();
      await b.stop();
    }
  });
});

it('a handler that ROLLBACKs the tick transaction itself while stop() is called: LOCK_NOT_HELD, and the tick given back for the next instance, as any run stop() ends', async () => {
  await oneNode(async ({ s, schema, admin, events }) => {
    let stopped: Promise<unknown> | undefined;
    s.register('job', '* * * * * *', async (run) => {
      await run.query('ROLLBACK');
      stopped = s.stop();
    });
    await s.runTick('job', new Date(BASE));
    await stopped;
    const ledger = (await admin.query(`SELECT status, attempt FROM "${schema}".runs`)).rows;
    expect(ledger).toEqual([{ status: 'PENDING', attempt: 0 }]);
    expect(events).toEqual(['error:LOCK_NOT_HELD']);
  });
});
