/**
 * The lock engine tells the truth and hands connections back clean: `executed: true` only when
 * the task's transaction committed, an unknown COMMIT outcome said as such, an abandoned wait's
 * cancel never reaching anyone else, session connections returned without a transaction or a
 * leftover hold, skips decided in any server language, aborts on a pool of one, and a caller's
 * own transaction left alone.
 */
import { randomBytes } from 'node:crypto';
import { createLockClient, hasCapability, type LockClient } from '@lockkit/core';
import { expect, onTestFinished, type TestContext } from 'vitest';
import { type ConformanceAdapter, gate, randomKey, rejection } from '../harness.js';
import { startRoundTripProxy } from '../proxy.js';
import { caseIt, casesOf, type Fixture, withLockkitSchema } from '../suite.js';

/** The SQLSTATE an error (or what it wraps) carries, whatever the driver. */
function sqlStateOf(error: unknown): string | undefined {
  let current: unknown = error;
  for (let depth = 0; depth < 4 && typeof current === 'object' && current !== null; depth++) {
    const { code, meta, originalCode } = current as {
      code?: unknown;
      meta?: { code?: unknown };
      originalCode?: unknown;
    };
    // Prisma's driver adapters keep the SQLSTATE as `originalCode`.
    for (const candidate of [code, meta?.code, originalCode]) {
      if (typeof candidate === 'string' && /^[0-9A-Z]{5}$/.test(candidate)) return candidate;
    }
    current = (current as { cause?: unknown }).cause;
  }
  return undefined;
}

/** The `code` of an error, whatever its class. */
const codeOf = (error: unknown): unknown => (error as { code?: unknown } | null)?.code;

/** Creates a one-column table with a primary key; returns its name and a reader of its ids. */
async function idTable<Tx, Session>(
  f: Fixture<Tx, Session>,
  key: 'PRIMARY KEY' | 'UNIQUE DEFERRABLE INITIALLY DEFERRED' = 'PRIMARY KEY',
): Promise<{ table: string; ids: () => Promise<number[]>; drop: () => Promise<void> }> {
  const table = `lockkit_truth_${randomBytes(6).toString('hex')}`;
  await f.observer.query(`CREATE TABLE ${table} (id int ${key})`);
  return {
    table,
    ids: async () =>
      (await f.observer.query<{ id: number }>(`SELECT id FROM ${table} ORDER BY id`)).map(
        (r) => r.id,
      ),
    drop: async () => {
      await f.observer.query(`DROP TABLE IF EXISTS ${table}`);
    },
  };
}

export function lockTruthCases<Tx, Session>(
  adapter: ConformanceAdapter<Tx, Session>,
  fixture: () => Fixture<Tx, Session>,
): void {
  const test = casesOf(adapter);
  // Capabilities are properties of the executor: a probe instance that never connects.
  const probe = adapter.createInstance({ url: adapter.databaseUrl(), poolSize: 1 });
  const session = hasCapability(probe.executor, 'session');
  const firstThenBegin = hasCapability(probe.executor, 'firstThenBegin');
  void probe.close();
  /** `test`, or a visible skip naming the missing capability. */
  const needs = (
    has: boolean,
    missing: string,
    id: Parameters<typeof test>[0],
    title: string,
    fn: () => Promise<void>,
    timeout?: number,
  ) =>
    caseIt(
      has
        ? adapter
        : {
            ...adapter,
            disable: { ...adapter.disable, [id]: `the ${adapter.name} executor has no ${missing}` },
          },
      id,
      title,
      fn,
      timeout,
    );

  test(
    'truth.caught-error-is-not-executed',
    'a task that catches its own SQL error and returns: COMMIT answered ROLLBACK, so the call rejects COMMIT_ROLLED_BACK and nothing is written',
    async () => {
      const f = fixture();
      const t = await idTable(f);
      try {
        await f.observer.query(`INSERT INTO ${t.table} VALUES (1)`);
        const error = await rejection(
          f.locks.withLock(randomKey(), async (_tx, ctx) => {
            await ctx.query(`INSERT INTO ${t.table} VALUES (2)`);
            // A duplicate key, caught by the task: the transaction is aborted from here on.
            await ctx.query(`INSERT INTO ${t.table} VALUES (1)`).catch(() => {});
            return 'done';
          }),
        );
        expect(codeOf(error)).toBe('COMMIT_ROLLED_BACK');
        expect(await t.ids()).toEqual([1]);
        // The connection came back clean: the next call commits.
        const again = await f.locks.withLock(randomKey(), async (_tx, ctx) => {
          await ctx.query(`INSERT INTO ${t.table} VALUES (3)`);
          return 'ok';
        });
        expect(again).toEqual({ executed: true, result: 'ok' });
        expect(await t.ids()).toEqual([1, 3]);
      } finally {
        await t.drop();
      }
    },
  );

  test(
    'truth.task-ended-transaction',
    "a task that ends lockkit's transaction itself (COMMIT, ROLLBACK, COMMIT AND CHAIN, COMMIT then BEGIN) rejects LOCK_NOT_HELD, never executed: true; a savepoint rolled back does not",
    async () => {
      const f = fixture();
      const oneTrip = hasCapability(f.instance.executor, 'firstThenBegin')
        ? [createLockClient(f.instance.executor, { oneRoundTripSkip: true })]
        : [];
      const endings: Record<string, string[]> = {
        COMMIT: ['COMMIT'],
        ROLLBACK: ['ROLLBACK'],
        'COMMIT AND CHAIN': ['COMMIT AND CHAIN'],
        'COMMIT then BEGIN': ['COMMIT', 'BEGIN'],
        // One query, several statements: a driver may report only the last command's tag.
        'COMMIT; BEGIN in one query': ['COMMIT; BEGIN'],
        'COMMIT; SELECT in one query': ['SELECT 1; COMMIT; SELECT 2'],
      };
      for (const locks of [f.locks, ...oneTrip]) {
        for (const wait of [false, true]) {
          for (const [what, statements] of Object.entries(endings)) {
            const key = randomKey();
            const label = `${what}, wait ${wait}, one trip ${locks !== f.locks}`;
            const outcome = await locks
              .withLock(
                key,
                async (_tx, ctx) => {
                  for (const statement of statements) await ctx.query(statement);
                  return 'done';
                },
                { wait },
              )
              .then(
                (result) => ({ result }),
                (error: unknown) => ({ error }),
              );
            expect(outcome, label).toEqual({ error: expect.anything() });
            const error = (outcome as { error: unknown }).error;
            // A driver may refuse the task's bare BEGIN itself (postgres.js does): then the call
            // rejects with the task's own error, which is as true.
            const refusedBegin = what === 'COMMIT then BEGIN' && /BEGIN/.test(String(error));
            // A driver may refuse several statements in one query (the extended protocol) or fail
            // on their results (Prisma): then the task's own error comes back, never success.
            const refusedMany =
              /in one query/.test(what) &&
              (codeOf(error) === undefined || /^[0-9A-Z]{5}$/.test(String(codeOf(error))));
            if (!refusedBegin && !refusedMany) {
              expect(codeOf(error), `${label}: ${String(error)}`).toBe('LOCK_NOT_HELD');
            }
            expect(await f.observer.locksOn(key), label).toEqual([]);
          }
          // A savepoint rolled back is the task's own business: the transaction lives on.
          const kept = await locks.withLock(
            randomKey(),
            async (_tx, ctx) => {
              await ctx.query('SAVEPOINT lockkit_conformance');
              await ctx.query('ROLLBACK TO SAVEPOINT lockkit_conformance');
              return 'kept';
            },
            { wait },
          );
          expect(kept, `savepoint, wait ${wait}`).toEqual({ executed: true, result: 'kept' });
        }
      }
      // The task's own COMMIT fails (a deferred unique key) and the task catches it: the
      // transaction rolled back and the lock went with it, with an error and no tag to tell.
      const t = await idTable(f, 'UNIQUE DEFERRABLE INITIALLY DEFERRED');
      try {
        await f.observer.query(`INSERT INTO ${t.table} VALUES (1)`);
        for (const locks of [f.locks, ...oneTrip]) {
          for (const wait of [false, true]) {
            const key = randomKey();
            const outcome = await locks
              .withLock(
                key,
                async (_tx, ctx) => {
                  await ctx.query(`INSERT INTO ${t.table} VALUES (1)`);
                  await ctx.query('COMMIT').catch(() => {});
                  return 'done';
                },
                { wait },
              )
              .then(
                (result) => ({ result }),
                (error: unknown) => ({ error }),
              );
            const label = `failed COMMIT, wait ${wait}, one trip ${locks !== f.locks}`;
            expect(outcome, label).toEqual({ error: expect.anything() });
            const error = (outcome as { error: unknown }).error;
            expect(codeOf(error), `${label}: ${String(error)}`).toBe('LOCK_NOT_HELD');
            expect(await f.observer.locksOn(key), label).toEqual([]);
          }
        }
        expect(await t.ids()).toEqual([1]);
      } finally {
        await t.drop();
      }
      // The connections came back clean: the next call commits.
      expect(await f.locks.withLock(randomKey(), async () => 'ok')).toEqual({
        executed: true,
        result: 'ok',
      });
    },
  );

  test(
    'truth.commit-failure-is-typed',
    'COMMIT itself fails (a deferred foreign key): the call rejects COMMIT_ROLLED_BACK with the driver error, SQLSTATE 23503, as cause, and nothing is written',
    async () => {
      const f = fixture();
      const suffix = randomBytes(6).toString('hex');
      const parent = `lockkit_truth_p_${suffix}`;
      const child = `lockkit_truth_c_${suffix}`;
      await f.observer.query(`CREATE TABLE ${parent} (id int PRIMARY KEY)`);
      await f.observer.query(
        `CREATE TABLE ${child} (id int, parent int REFERENCES ${parent} (id) DEFERRABLE INITIALLY DEFERRED)`,
      );
      try {
        const error = await rejection(
          f.locks.withLock(randomKey(), async (_tx, ctx) => {
            // Accepted now, checked at COMMIT: there is no parent 99.
            await ctx.query(`INSERT INTO ${child} VALUES (1, 99)`);
            return 'done';
          }),
        );
        expect(codeOf(error)).toBe('COMMIT_ROLLED_BACK');
        expect((error as { cause?: unknown }).cause).toBeDefined();
        expect(sqlStateOf((error as { cause?: unknown }).cause)).toBe('23503');
        const rows = await f.observer.query<{ n: number }>(
          `SELECT count(*)::int AS n FROM ${child}`,
        );
        expect(rows[0]?.n).toBe(0);
      } finally {
        await f.observer.query(`DROP TABLE IF EXISTS ${child}, ${parent}`);
      }
    },
  );

  test(
    'truth.fenced-caught-error-is-not-written',
    'a fenced write that catches its own SQL error: the call rejects COMMIT_ROLLED_BACK, nothing is written, the lease run records FAILED',
    () =>
      withLockkitSchema(fixture(), async (schema, locks) => {
        const f = fixture();
        const t = `"${schema}".ids`;
        await f.observer.query(`CREATE TABLE ${t} (id int PRIMARY KEY)`);
        await f.observer.query(`INSERT INTO ${t} VALUES (1)`);
        const error = await rejection(
          locks.runWithLease('lockkit-truth', randomBytes(6).toString('hex'), (lease) =>
            lease.fenced(async (_tx, query) => {
              await query(`INSERT INTO ${t} VALUES (2)`);
              await query(`INSERT INTO ${t} VALUES (1)`).catch(() => {});
              return 'written';
            }),
          ),
        );
        expect(codeOf(error), String(error)).toBe('COMMIT_ROLLED_BACK');
        const ids = await f.observer.query<{ id: number }>(`SELECT id FROM ${t} ORDER BY id`);
        expect(ids.map((r) => r.id)).toEqual([1]);
      }),
  );

  test(
    'truth.fenced-commit-truth',
    'a fenced write whose COMMIT fails (a deferred foreign key) rejects COMMIT_ROLLED_BACK with the driver error as cause; one whose task ends the transaction itself rejects LOCK_NOT_HELD; neither is reported written',
    () =>
      withLockkitSchema(fixture(), async (schema, locks) => {
        const f = fixture();
        const parent = `"${schema}".parents`;
        const child = `"${schema}".children`;
        await f.observer.query(`CREATE TABLE ${parent} (id int PRIMARY KEY)`);
        await f.observer.query(
          `CREATE TABLE ${child} (id int, parent int REFERENCES ${parent} (id) DEFERRABLE INITIALLY DEFERRED)`,
        );
        const deferred = await rejection(
          locks.runWithLease('lockkit-truth', randomBytes(6).toString('hex'), (lease) =>
            lease.fenced(async (_tx, query) => {
              // Accepted now, checked at COMMIT: there is no parent 99.
              await query(`INSERT INTO ${child} VALUES (1, 99)`);
              return 'written';
            }),
          ),
        );
        expect(codeOf(deferred), String(deferred)).toBe('COMMIT_ROLLED_BACK');
        expect(sqlStateOf((deferred as { cause?: unknown }).cause)).toBe('23503');
        const ended = await rejection(
          locks.runWithLease('lockkit-truth', randomBytes(6).toString('hex'), (lease) =>
            lease.fenced(async (_tx, query) => {
              await query('COMMIT');
              await query(`INSERT INTO ${parent} VALUES (7)`);
              return 'written';
            }),
          ),
        );
        expect(codeOf(ended), String(ended)).toBe('LOCK_NOT_HELD');
        expect(await f.observer.query(`SELECT 1 FROM ${child}`)).toEqual([]);
      }),
  );

  test(
    'truth.lost-commit-reply-is-unknown',
    'the link dies after COMMIT was sent (the server committed): the call rejects COMMIT_OUTCOME_UNKNOWN, never "released, rolled back"',
    async () => {
      const f = fixture();
      const t = await idTable(f);
      const proxy = await startRoundTripProxy(f.url);
      // Closed after the fixture's checks, which may still talk through it.
      onTestFinished(() => proxy.close());
      try {
        const instance = f.newInstance(2, proxy.url);
        const locks = createLockClient(instance.executor);
        const cut = proxy.holdCommitReply();
        const error = await rejection(
          locks.withLock(randomKey(), async (_tx, ctx) => {
            await ctx.query(`INSERT INTO ${t.table} VALUES (1)`);
            return 'written';
          }),
        );
        await cut;
        expect(codeOf(error), String(error)).toBe('COMMIT_OUTCOME_UNKNOWN');
        // Why "unknown" and not "rolled back": here the server did commit.
        expect(await t.ids()).toEqual([1]);
      } finally {
        await t.drop();
      }
    },
    20_000,
  );

  test(
    'truth.lost-opening-is-typed',
    'the link dies while the opening statement (BEGIN and the try-lock) is on its way, or after the server ran it: the call rejects CONNECTION_LOST, never a raw driver error (found by the fault-point group)',
    async () => {
      const f = fixture();
      const proxy = await startRoundTripProxy(f.url);
      // Closed after the fixture's checks, which may still talk through it.
      onTestFinished(() => proxy.close());
      const instance = f.newInstance(1, proxy.url);
      const locks = createLockClient(instance.executor, { engineSelfTest: false });
      const key = randomKey();
      // Warm up: the driver's own first queries run now, so the opening is statement 0 below.
      expect(await locks.withLock(key, async () => 'warm')).toEqual({
        executed: true,
        result: 'warm',
      });
      for (const fault of ['drop-before', 'drop-after'] as const) {
        const trap = proxy.trapStatement(0, fault);
        const outcome = await locks
          .withLock(key, async () => 'ran')
          .then(
            (result) => result,
            (error: unknown) => error,
          );
        await trap.fired;
        // An adapter may begin once more on a fresh connection when a bare BEGIN got no answer
        // (retryDeadStart: nothing of the call had run, and that transaction never committed):
        // the task then ran once. Otherwise the call rejects, typed.
        if (outcome instanceof Error)
          expect(codeOf(outcome), `${fault}: ${String(outcome)}`).toBe('CONNECTION_LOST');
        else expect(outcome, fault).toEqual({ executed: true, result: 'ran' });
        // Nothing wedged: the next call takes the lock and runs.
        expect(await locks.withLock(key, async () => 'next')).toEqual({
          executed: true,
          result: 'next',
        });
      }
    },
  );

  test(
    'truth.late-cancel-hits-nobody-else',
    "an abandoned wait's cancel, arriving after the waiter was granted and its connection reused, never cancels the next user's query",
    async () => {
      const f = fixture();
      const proxy = await startRoundTripProxy(f.url);
      // Closed after the fixture's checks, which may still talk through it.
      onTestFinished(() => proxy.close());
      const instance = f.newInstance(2, proxy.url);
      const locks = createLockClient(instance.executor);
      const key = randomKey();
      const release = gate();
      const holder = f.locks.withLock(key, async () => {
        await release.promise;
      });
      await f.observer.until(async () => (await f.observer.locksOn(key)).length === 1);
      const cancels = proxy.holdCancels();
      const controller = new AbortController();
      const waiter = rejection(
        locks.withLock(key, async () => 'ran', { wait: true, signal: controller.signal }),
      );
      let waiterPid = 0;
      expect(
        await f.observer.until(async () => {
          const waiting = (await f.observer.locksOn(key)).find((l) => !l.granted);
          waiterPid = waiting?.pid ?? 0;
          return waiting !== undefined;
        }),
      ).toBe(true);
      controller.abort(new Error('caller gave up'));
      // The cancel is on its way, held at the proxy, while the holder lets go: the waiter is
      // granted, sees its abort and gives the lock back.
      await cancels.started;
      release.open();
      await holder;
      expect(
        await f.observer.until(async () => {
          if ((await f.observer.locksOn(key)).length > 0) return false;
          const rows = await f.observer.query<{ state: string }>(
            'SELECT state FROM pg_stat_activity WHERE pid = $1',
            [waiterPid],
          );
          return rows.length === 0 || rows[0]?.state === 'idle';
        }),
      ).toBe(true);
      // An unrelated query, on whatever connection the pool hands out now.
      const unrelated = instance.executor.transaction((ctx) =>
        ctx.query('SELECT pg_sleep(0.5)::text AS slept'),
      );
      expect(
        await f.observer.until(
          async () =>
            (
              await f.observer.query(
                `SELECT 1 FROM pg_stat_activity
                  WHERE application_name = $1 AND state = 'active' AND query LIKE '%pg_sleep(0.5)%'`,
                [f.applicationName],
              )
            ).length > 0,
        ),
      ).toBe(true);
      // Now the late cancel reaches the server.
      cancels.release();
      await expect(unrelated).resolves.toHaveLength(1);
      expect(codeOf(await waiter)).toBe('ABORTED');
    },
    20_000,
  );

  needs(
    session,
    'session capability',
    'truth.session-open-transaction-rolled-back',
    "a session task that leaves its own transaction open: the connection comes back idle, the task's insert rolled back, the next user's insert kept",
    async () => {
      const f = fixture();
      const t = await idTable(f);
      try {
        // A pool of one: the next user gets this very connection.
        const instance = f.newInstance(1);
        const locks = createLockClient(instance.executor);
        const boom = new Error('session task failed');
        const error = await rejection(
          locks.withSessionLock(randomKey(), async (_s, ctx) => {
            await ctx.query('BEGIN');
            await ctx.query(`INSERT INTO ${t.table} VALUES (1)`);
            throw boom;
          }),
        );
        expect(error).toBe(boom);
        expect(await f.observer.busyConnectionsOf(f.applicationName)).toEqual([]);
        await instance.executor.transaction((ctx) =>
          ctx.query(`INSERT INTO ${t.table} VALUES (2)`),
        );
        expect(await t.ids()).toEqual([2]);
      } finally {
        await t.drop();
      }
    },
  );

  needs(
    session,
    'session capability',
    'truth.session-reacquired-key-freed',
    'a session task that takes its key again (both modes, twice): every hold is released with the call, so the next caller runs',
    async () => {
      const f = fixture();
      const key = randomKey();
      const [k1, k2] = key.pair as readonly [number, number];
      const r = await f.locks.withSessionLock(key, async (_s, ctx) => {
        await ctx.query('SELECT pg_advisory_lock($1::int4, $2::int4)', [k1, k2]);
        await ctx.query('SELECT pg_advisory_lock($1::int4, $2::int4)', [k1, k2]);
        await ctx.query('SELECT pg_advisory_lock_shared($1::int4, $2::int4)', [k1, k2]);
        return 'ran';
      });
      expect(r).toEqual({ executed: true, result: 'ran' });
      expect(await f.observer.locksOn(key)).toEqual([]);
      const other = createLockClient(f.newInstance(1).executor);
      expect(await other.withSessionLock(key, async () => 'next')).toEqual({
        executed: true,
        result: 'next',
      });
    },
  );

  needs(
    firstThenBegin,
    'firstThenBegin capability (one-round-trip skips)',
    'truth.one-trip-skip-any-language',
    'with lc_messages in French, a one-round-trip skip is still { executed: false }',
    // vitest hands every test its context: a missing locale skips the case visibly, with why.
    async (context?: TestContext) => {
      const f = fixture();
      const language = 'fr_FR.UTF-8';
      let why: string | undefined;
      try {
        await f.observer.query(`SET lc_messages = '${language}'`);
        // The locale may exist while the server has no translations (a build without NLS, such
        // as the embedded binaries): then its messages stay English and there is nothing to test.
        const probe = await f.observer.query("SELECT 'x'::boolean").then(
          () => '',
          (error: unknown) => String((error as Error).message),
        );
        if (!/syntaxe/.test(probe))
          why = `the test server accepts lc_messages = ${language} but has no French translations (its messages stay: ${probe}); run against a server built with NLS, e.g. Debian's postgresql`;
        await f.observer.query('RESET lc_messages');
      } catch (error) {
        why = `the test server cannot speak ${language} (${String(error)}): install the locale on the server's host (e.g. \`localedef --no-archive -i fr_FR -f UTF-8 fr_FR.UTF-8\`) and the PostgreSQL translations`;
      }
      if (why !== undefined) {
        if (context) context.skip(why);
        throw new Error(why);
      }
      const url = new URL(f.url);
      url.searchParams.set('options', `-c lc_messages=${language}`);
      const instance = f.newInstance(2, url.toString());
      const locks: LockClient<Tx, Session> = createLockClient(instance.executor, {
        oneRoundTripSkip: true,
      });
      // The server does speak French on these connections.
      const french = await rejection(
        instance.executor.transaction((ctx) => ctx.query("SELECT 'x'::boolean")),
      );
      expect(String((french as Error).message)).toMatch(/syntaxe/);
      const key = randomKey();
      const release = gate();
      const held = gate();
      const holder = f.locks.withLock(key, async () => {
        held.open();
        await release.promise;
      });
      await held.promise;
      try {
        expect(await locks.withLock(key, async () => 'ran')).toEqual({ executed: false });
      } finally {
        release.open();
        await holder;
      }
      expect(await locks.withLock(key, async () => 'ran')).toEqual({
        executed: true,
        result: 'ran',
      });
    },
  );

  test(
    'truth.pool-of-one-abort',
    'on a pool of one, aborting a blocking wait rejects ABORTED while the holder still holds (no second connection needed)',
    async () => {
      const f = fixture();
      const instance = f.newInstance(1);
      const locks = createLockClient(instance.executor);
      const key = randomKey();
      const release = gate();
      let released = false;
      const holder = f.locks.withLock(key, async () => {
        await release.promise;
      });
      await f.observer.until(async () => (await f.observer.locksOn(key)).length === 1);
      // Only a safety valve for the failing case (a wait the abort never ends), not a timing
      // assertion: the check below is that the waiter settled while the holder still held.
      const valve = setTimeout(() => {
        released = true;
        release.open();
      }, 8000);
      try {
        const controller = new AbortController();
        const waiter = rejection(
          locks.withLock(key, async () => 'ran', { wait: true, signal: controller.signal }),
        );
        expect(
          await f.observer.until(async () =>
            (await f.observer.locksOn(key)).some((l) => !l.granted),
          ),
        ).toBe(true);
        controller.abort(new Error('caller gave up'));
        const error = await waiter;
        expect(released, 'the abort only took effect once the holder let go').toBe(false);
        expect(codeOf(error)).toBe('ABORTED');
      } finally {
        clearTimeout(valve);
        release.open();
        await holder;
      }
    },
    15_000,
  );

  test(
    'truth.pool-wait-abort',
    "on a pool of one whose connection another task holds, a call's signal ends its wait for the connection: it rejects ABORTED while the connection is still busy, its task never runs, and the connection it would have had goes back to the pool",
    () =>
      withLockkitSchema(fixture(), async (schema) => {
        const f = fixture();
        const locks = createLockClient(f.newInstance(1).executor, { schema });
        // The client's engine self-test, done now: later calls need no connection before their own.
        await locks.withLock(randomKey(), async () => undefined);
        const calls: Record<string, (signal: AbortSignal, ran: () => void) => Promise<unknown>> = {
          'withLock (try)': (signal, ran) =>
            locks.withLock(randomKey(), async () => ran(), { signal }),
          'withLock (wait)': (signal, ran) =>
            locks.withLock(randomKey(), async () => ran(), { wait: true, signal }),
          runExclusiveJob: (signal, ran) =>
            locks.runExclusiveJob(
              'lockkit-conformance',
              `pool-wait-${randomBytes(4).toString('hex')}`,
              async () => ran(),
              {
                signal,
              },
            ),
          ...(hasCapability(f.instance.executor, 'session') &&
            !f.instance.executor.transactionPooler && {
              withSessionLock: (signal: AbortSignal, ran: () => void) =>
                locks.withSessionLock(randomKey(), async () => ran(), { signal }),
            }),
          runWithLease: (signal, ran) =>
            locks.runWithLease(
              'lockkit-conformance',
              `pool-wait-${randomBytes(4).toString('hex')}`,
              async () => ran(),
              {
                signal,
              },
            ),
        };
        const outcomes: Record<string, unknown> = {};
        for (const [name, call] of Object.entries(calls)) {
          const release = gate();
          const busy = gate();
          const holder = locks.withLock(randomKey(), async () => {
            busy.open();
            await release.promise;
          });
          await busy.promise;
          let ran = false;
          let stillBusy = true;
          try {
            const controller = new AbortController();
            const waiter = rejection(call(controller.signal, () => (ran = true)));
            controller.abort(new Error('caller gave up'));
            // Only a safety valve for the failing case (a wait the abort never ends): the holder
            // lets go after 8 s, and the check is that the waiter had settled before that.
            const valve = setTimeout(() => {
              stillBusy = false;
              release.open();
            }, 8000);
            const error = await waiter;
            clearTimeout(valve);
            outcomes[name] = { code: codeOf(error), settledWhileBusy: stillBusy };
          } finally {
            release.open();
            await holder;
          }
          // The connection the abandoned call was queued for came back: the next call runs.
          const next = await locks.withLock(randomKey(), async () => 'next');
          outcomes[name] = { ...(outcomes[name] as object), ran, next: next.executed };
        }
        const expected = Object.fromEntries(
          Object.keys(calls).map((name) => [
            name,
            { code: 'ABORTED', settledWhileBusy: true, ran: false, next: true },
          ]),
        );
        expect(outcomes).toEqual(expected);
      }),
    60_000,
  );

  test(
    'truth.pool-of-one-nested',
    'on a pool of one, a lockkit call from inside a task rejects NESTED_CALL at once instead of waiting forever for the connection the task holds',
    async () => {
      const f = fixture();
      const locks = createLockClient(f.newInstance(1).executor);
      const calls: Record<string, () => Promise<unknown>> = {
        withLock: () => locks.withLock(randomKey(), async () => 'inner'),
        runExclusiveJob: () =>
          locks.runExclusiveJob('lockkit-conformance', 'nested', async () => 1),
        ...(hasCapability(f.instance.executor, 'session') && {
          withSessionLock: () => locks.withSessionLock(randomKey(), async () => 'inner'),
        }),
      };
      const outer = {
        withLock: (inner: () => Promise<unknown>) => locks.withLock(randomKey(), inner),
        ...(hasCapability(f.instance.executor, 'session') && {
          withSessionLock: (inner: () => Promise<unknown>) =>
            locks.withSessionLock(randomKey(), inner),
        }),
      };
      for (const [outerName, run] of Object.entries(outer)) {
        for (const [innerName, inner] of Object.entries(calls)) {
          // Only a safety valve for the failing case (an inner call that waits forever).
          let valve: NodeJS.Timeout | undefined;
          const hung = new Promise<never>((_, reject) => {
            valve = setTimeout(() => reject(new Error('the nested call hung')), 5000);
          });
          try {
            const error = await Promise.race([rejection(run(inner)), hung]);
            expect(codeOf(error), `${innerName} in ${outerName}: ${String(error)}`).toBe(
              'NESTED_CALL',
            );
          } finally {
            clearTimeout(valve);
          }
        }
      }
      // The pool of one is free again, and a call after the task is no nested call.
      expect(await locks.withLock(randomKey(), async () => 'after')).toEqual({
        executed: true,
        result: 'after',
      });
    },
    60_000,
  );

  const single = adapter.singleConnection;
  needs(
    single !== undefined,
    'single-connection handle (a pg.Client)',
    'truth.caller-transaction-open',
    "on a client inside the caller's own transaction: refused with CALLER_TRANSACTION_OPEN, the caller's work untouched; a nested call on the same client rejects NESTED_CALL at once",
    async () => {
      const f = fixture();
      const t = await idTable(f);
      const one = await (single as NonNullable<typeof single>)(f.url);
      try {
        const locks = createLockClient(one.executor);
        await one.query('BEGIN');
        await one.query(`INSERT INTO ${t.table} VALUES (1)`);
        const refused = await rejection(locks.withLock(randomKey(), async () => 'ran'));
        expect(codeOf(refused), String(refused)).toBe('CALLER_TRANSACTION_OPEN');
        if (hasCapability(one.executor, 'session')) {
          // Session scope too: cleaning the connection afterwards would end the caller's work.
          const session = await rejection(locks.withSessionLock(randomKey(), async () => 'ran'));
          expect(codeOf(session), String(session)).toBe('CALLER_TRANSACTION_OPEN');
        }
        await one.query('ROLLBACK');
        expect(await t.ids()).toEqual([]);
        // A nested call on the one connection cannot ever get it: it must say so, not hang.
        let valve: NodeJS.Timeout | undefined;
        const hung = new Promise<never>((_, reject) => {
          valve = setTimeout(() => reject(new Error('the nested call hung')), 5000);
        });
        try {
          const nested = await Promise.race([
            rejection(
              locks.withLock(randomKey(), async () =>
                locks.withLock(randomKey(), async () => 'inner'),
              ),
            ),
            hung,
          ]);
          expect(codeOf(nested), String(nested)).toBe('NESTED_CALL');
        } finally {
          clearTimeout(valve);
        }
      } finally {
        await one.close();
        await t.drop();
      }
    },
    15_000,
  );
}
