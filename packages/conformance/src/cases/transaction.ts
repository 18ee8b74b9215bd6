/**
 * Transaction-scoped locks: every adapter has them, so this group always runs.
 */
import {
  ConnectionLostError,
  createLockClient,
  isLockkitError,
  type LockExecutor,
  LockKey,
  LockKeyError,
  type LockkitError,
  LockTimeoutError,
} from '@lockkit/core';
import { expect } from 'vitest';
import {
  aborted,
  type ConformanceAdapter,
  gate,
  occupyPool,
  randomInt8Key,
  randomKey,
  rejection,
  turn,
} from '../harness.js';
import { casesOf, type Fixture } from '../suite.js';

export function transactionCases<Tx, Session>(
  adapter: ConformanceAdapter<Tx, Session>,
  fixture: () => Fixture<Tx, Session>,
): void {
  const test = casesOf(adapter);

  test(
    'transaction.exactly-one-of-50',
    '50 contenders on their own connections: exactly one runs, the rest skip without waiting',
    async () => {
      const f = fixture();
      const instance = f.newInstance(55);
      const locks = createLockClient(instance.executor);
      const key = randomKey();
      const contenders = 50;
      const losersDone = gate();
      let decided = 0;
      let executed = 0;
      const decide = () => {
        decided++;
        if (decided === contenders - 1) losersDone.open();
      };
      const results = await Promise.all(
        Array.from({ length: contenders }, async () => {
          const r = await locks.withLock(key, async () => {
            executed++;
            // Hold the lock until every other contender has returned: they cannot have waited
            // for it, since it is still held.
            await losersDone.promise;
            return 'ran';
          });
          if (!r.executed) decide();
          return r;
        }),
      );
      expect(executed).toBe(1);
      expect(results.filter((r) => r.executed)).toEqual([{ executed: true, result: 'ran' }]);
      expect(results.filter((r) => !r.executed)).toHaveLength(contenders - 1);
    },
    60_000,
  );

  test(
    'transaction.release-on-commit',
    'the lock is visible in pg_locks while the task runs and gone after commit',
    async () => {
      const f = fixture();
      const key = randomKey();
      const r = await f.locks.runExclusiveJob(
        key.names?.namespace as string,
        key.names?.jobKey as string,
        async (_tx, ctx) => {
          const seen = await f.observer.locksOn(ctx.key);
          expect(seen).toHaveLength(1);
          expect(seen[0]).toMatchObject({ mode: 'ExclusiveLock', granted: true });
          expect(ctx.key.equals(key)).toBe(true);
          expect(ctx.signal.aborted).toBe(false);
          return 7;
        },
      );
      expect(r).toEqual({ executed: true, result: 7 });
      expect(await f.observer.locksOn(key)).toEqual([]);
      // And it can be taken again at once.
      expect((await f.locks.withLock(key, async () => 1)).executed).toBe(true);
    },
  );

  test(
    'transaction.release-on-throw',
    'a throwing task rolls back, releases the lock and rethrows its own error unchanged',
    async () => {
      const f = fixture();
      const key = randomKey();
      const boom = new Error('task failed');
      const error = await rejection(
        f.locks.withLock(key, async (_tx, ctx) => {
          await ctx.query('CREATE TEMP TABLE lockkit_conf_rollback (x int) ON COMMIT DROP');
          throw boom;
        }),
      );
      expect(error).toBe(boom);
      expect(await f.observer.locksOn(key)).toEqual([]);
      expect((await f.locks.withLock(key, async () => 'again')).executed).toBe(true);
    },
  );

  if (adapter.nativeQuery) {
    const nativeQuery = adapter.nativeQuery;
    test(
      'transaction.native-handle-joins',
      "writes through the driver's own transaction handle commit and roll back with the lock",
      async () => {
        const f = fixture();
        const table = `lockkit_conf_${randomKey().pair?.[1]}`.replace('-', 'm');
        await f.observer.query(`CREATE TABLE ${table} (v int)`);
        try {
          await f.locks.withLock(randomKey(), (tx) =>
            nativeQuery(tx, `INSERT INTO ${table} VALUES (1)`),
          );
          await rejection(
            f.locks.withLock(randomKey(), async (tx) => {
              await nativeQuery(tx, `INSERT INTO ${table} VALUES (2)`);
              throw new Error('undo');
            }),
          );
          const rows = await f.observer.query<{ v: number }>(`SELECT v FROM ${table}`);
          expect(rows).toEqual([{ v: 1 }]);
        } finally {
          await f.observer.query(`DROP TABLE ${table}`);
        }
      },
    );
  }

  test(
    'transaction.shared-and-exclusive',
    'shared holders coexist; shared and exclusive exclude each other',
    async () => {
      const f = fixture();
      const key = randomKey();
      const inner = gate();
      const outer = f.locks.withLock(
        key,
        async () => {
          const shared = await f.locks.withLock(key, async () => 'both', { mode: 'shared' });
          const exclusive = await f.locks.withLock(key, async () => 'no');
          inner.open();
          return { shared, exclusive };
        },
        { mode: 'shared' },
      );
      await inner.promise;
      expect(await outer).toEqual({
        executed: true,
        result: { shared: { executed: true, result: 'both' }, exclusive: { executed: false } },
      });
      const underExclusive = await f.locks.withLock(key, async () => {
        const modes = (await f.observer.locksOn(key)).map((l) => l.mode);
        return {
          modes,
          shared: await f.locks.withLock(key, async () => 'no', { mode: 'shared' }),
        };
      });
      expect(underExclusive).toEqual({
        executed: true,
        result: { modes: ['ExclusiveLock'], shared: { executed: false } },
      });
    },
  );

  test(
    'transaction.blocking-waits',
    'a waiting acquisition blocks while the lock is held, then runs once it is released',
    async () => {
      const f = fixture();
      const key = randomKey();
      const release = gate();
      const order: string[] = [];
      const holder = f.locks.withLock(key, async () => {
        order.push('holder');
        await release.promise;
      });
      await f.observer.until(async () => (await f.observer.locksOn(key)).length === 1);
      const waiter = f.locks.withLock(
        key,
        async () => {
          order.push('waiter');
          return 'waited';
        },
        { wait: true, timeoutMs: 20_000 },
      );
      // The waiter is visible in pg_locks as not granted while the holder holds.
      expect(
        await f.observer.until(async () => (await f.observer.locksOn(key)).some((l) => !l.granted)),
      ).toBe(true);
      expect(order).toEqual(['holder']);
      release.open();
      await holder;
      expect(await waiter).toEqual({ executed: true, result: 'waited' });
      expect(order).toEqual(['holder', 'waiter']);
    },
  );

  test(
    'transaction.blocking-timeout',
    'a wait longer than timeoutMs fails with LockTimeoutError and never runs the task',
    async () => {
      const f = fixture();
      const key = randomKey();
      const release = gate();
      const holder = f.locks.withLock(key, () => release.promise);
      await f.observer.until(async () => (await f.observer.locksOn(key)).length === 1);
      let ran = false;
      const error = await rejection(
        f.locks.withLock(
          key,
          async () => {
            ran = true;
          },
          { wait: true, timeoutMs: 100 },
        ),
      );
      release.open();
      await holder;
      expect(error).toBeInstanceOf(LockTimeoutError);
      expect((error as LockkitError).code).toBe('LOCK_TIMEOUT');
      expect(ran).toBe(false);
    },
  );

  test(
    'transaction.abort-cancels-wait',
    "aborting the caller's signal cancels a wait with code ABORTED",
    async () => {
      const f = fixture();
      const key = randomKey();
      const release = gate();
      const holder = f.locks.withLock(key, () => release.promise);
      await f.observer.until(async () => (await f.observer.locksOn(key)).length === 1);
      const controller = new AbortController();
      const waiting = rejection(
        f.locks.withLock(key, async () => 'never', { wait: true, signal: controller.signal }),
      );
      await f.observer.until(async () => (await f.observer.locksOn(key)).some((l) => !l.granted));
      controller.abort(new Error('shutting down'));
      const error = await waiting;
      release.open();
      await holder;
      expect(isLockkitError(error) && error.code).toBe('ABORTED');
      // An already-aborted signal fails before any SQL.
      await expect(
        f.locks.withLock(key, async () => 1, { wait: true, signal: controller.signal }),
      ).rejects.toMatchObject({ code: 'ABORTED' });
    },
  );

  test(
    'transaction.terminated-holder',
    "a terminated holder: the task's signal fires, the caller gets ConnectionLostError, another worker takes over, the pool recovers",
    async () => {
      const f = fixture();
      const key = randomKey();
      let signalReason: unknown;
      const error = await rejection(
        f.locks.withLock(key, async (_tx, ctx) => {
          const [row] = await ctx.query('SELECT pg_backend_pid() AS pid');
          await f.observer.terminate(Number(row?.pid));
          signalReason = await aborted(ctx.signal, 10_000);
          return 'finished anyway';
        }),
      );
      expect(signalReason).toBeDefined();
      expect(error).toBeInstanceOf(ConnectionLostError);
      expect(await f.observer.until(async () => (await f.observer.locksOn(key)).length === 0)).toBe(
        true,
      );
      const other = createLockClient(f.newInstance(2).executor);
      expect(await other.withLock(key, async () => 'taken over')).toEqual({
        executed: true,
        result: 'taken over',
      });
      // The first pool recovers: its broken connection was discarded, not reused.
      for (let i = 0; i < 12; i++) {
        expect((await f.locks.withLock(randomKey(), async () => i)).executed).toBe(true);
      }
    },
  );

  test(
    'transaction.savepoint-rollback',
    'a lock taken inside a savepoint that rolls back is released; the outer lock stays',
    async () => {
      const f = fixture();
      const outer = randomKey();
      const inner = randomKey();
      await f.locks.withLock(outer, async (_tx, ctx) => {
        await ctx.query('SAVEPOINT lockkit_conf');
        const [row] = await ctx.query(
          'SELECT pg_try_advisory_xact_lock($1::int4, $2::int4) AS ok',
          [inner.pair?.[0], inner.pair?.[1]],
        );
        expect(row?.ok).toBe(true);
        expect(await f.observer.locksOn(inner)).toHaveLength(1);
        await ctx.query('ROLLBACK TO SAVEPOINT lockkit_conf');
        expect(await f.observer.locksOn(inner)).toEqual([]);
        expect(await f.observer.locksOn(outer)).toHaveLength(1);
      });
    },
  );

  test(
    'transaction.int8-keys',
    'int8 keys lock their own key space and appear in pg_locks with objsubid 1',
    async () => {
      const f = fixture();
      const key = randomInt8Key();
      const r = await f.locks.withLock(key, async () => {
        const [seen] = await f.observer.locksOn(key);
        const twin = LockKey.fromPair(key.pgLocks.classid | 0, key.pgLocks.objid | 0);
        return {
          objsubid: seen?.key.pgLocks.objsubid,
          same: await f.locks.withLock(key, async () => 'no'),
          twin: await f.locks.withLock(twin, async () => 'yes'),
        };
      });
      expect(r).toEqual({
        executed: true,
        result: { objsubid: 1, same: { executed: false }, twin: { executed: true, result: 'yes' } },
      });
    },
  );

  test(
    'transaction.statement-timeout',
    'statementTimeoutMs bounds every statement of the task; the lock is released',
    async () => {
      const f = fixture();
      const key = randomKey();
      const error = await rejection(
        f.locks.withLock(key, (_tx, ctx) => ctx.query('SELECT pg_sleep(5)::text'), {
          statementTimeoutMs: 100,
        }),
      );
      expect(isLockkitError(error) && error.code).toBe('STATEMENT_TIMEOUT');
      expect((await f.locks.withLock(key, async () => 1)).executed).toBe(true);
    },
  );

  test(
    'transaction.idle-in-transaction-timeout',
    'a task that stalls past idleInTransactionTimeoutMs loses its connection and lock, with a signal and a typed error',
    async () => {
      const f = fixture();
      const key = randomKey();
      let reason: unknown;
      const error = await rejection(
        f.locks.withLock(
          key,
          async (_tx, ctx) => {
            reason = await aborted(ctx.signal, 10_000);
          },
          { idleInTransactionTimeoutMs: 200 },
        ),
      );
      expect(reason).toBeDefined();
      expect(error).toBeInstanceOf(ConnectionLostError);
      expect(await f.observer.until(async () => (await f.observer.locksOn(key)).length === 0)).toBe(
        true,
      );
    },
  );

  test(
    'transaction.bad-input',
    'bad keys, tasks and options fail with typed errors before any SQL',
    async () => {
      const f = fixture();
      const task = async () => 1;
      await expect(f.locks.runExclusiveJob('', 'job', task)).rejects.toBeInstanceOf(LockKeyError);
      await expect(
        f.locks.runExclusiveJob('ns', 42 as unknown as string, task),
      ).rejects.toMatchObject({ code: 'KEY_NOT_STRING' });
      const key = randomKey();
      const invalid = [
        f.locks.withLock({} as LockKey, task),
        f.locks.withLock(key, 'task' as unknown as typeof task),
        f.locks.withLock(key, task, { mode: 'shared-ish' as 'shared' }),
        f.locks.withLock(key, task, { timeoutMs: 10 }),
        f.locks.withLock(key, task, { wait: true, timeoutMs: -1 }),
        f.locks.withLock(key, task, { wait: true, timeoutMs: 1.5 }),
        f.locks.withLock(key, task, { statementTimeoutMs: Number.NaN }),
        f.locks.withLock(key, task, { signal: {} as AbortSignal }),
      ];
      for (const call of invalid) {
        await expect(call).rejects.toMatchObject({ code: 'OPTION_INVALID' });
      }
      expect((await f.instance.checkedOut?.()) ?? 0).toBe(0);
    },
  );

  for (const oneTrip of [false, true]) {
    test(
      oneTrip ? 'transaction.abort-while-queued.one-trip' : 'transaction.abort-while-queued',
      `a signal aborted while the call waits for a pooled connection${oneTrip ? ' (one-round-trip skips)' : ''}: the call rejects ABORTED at once; when the pool lends its connection later, the abandoned call takes no lock, not even for a round trip, and the task never starts`,
      async () => {
        const f = fixture();
        // A pool of one, held by another call: the next call queues for the connection.
        const held = holdingCallbacks(f.newInstance(1).executor);
        const locks = createLockClient(held.executor, {
          engineSelfTest: false,
          ...(oneTrip && { oneRoundTripSkip: true }),
        });
        const release = gate();
        const started = gate();
        const holder = locks.withLock(randomKey(), async () => {
          started.open();
          await release.promise;
        });
        await started.promise;
        const controller = new AbortController();
        const key = randomKey();
        let ran = false;
        held.arm();
        const queued = rejection(
          locks.withLock(
            key,
            async () => {
              ran = true;
            },
            { signal: controller.signal },
          ),
        );
        // The call has asked its executor for a connection: abort it while it waits there.
        const ghost = (await held.called).promise;
        controller.abort(new Error('the caller gave up'));
        const error = await queued;
        expect(isLockkitError(error) && error.code, String(error)).toBe('ABORTED');
        try {
          release.open();
          expect((await holder).executed).toBe(true);
          // The abandoned call gets the connection now. Stop it where its callback would start
          // (the executor has sent what it sends first), or see it give the connection back.
          await Promise.race([held.entered, ghost.then(noop, noop)]);
          expect(
            (await f.locks.withLock(key, async () => 'free')).executed,
            'the key is free while the abandoned call holds its connection',
          ).toBe(true);
        } finally {
          held.resume();
        }
        await rejection(ghost);
        expect(ran).toBe(false);
        expect((await f.locks.withLock(key, async () => 'free')).executed).toBe(true);
      },
    );
  }

  test(
    'transaction.abort-while-self-test-queued',
    "a new client's first call, whose engine self-test waits for a pooled connection, is aborted there: it rejects ABORTED at once, not when the pool frees up; the task never starts, the key stays free, and the client's next call runs",
    async () => {
      const f = fixture();
      const pooled = f.newInstance(2).executor;
      const { release, holders } = await occupyPool(pooled, 2, 'transaction');
      // A new client: its first call runs the engine self-test, which now queues for a connection.
      const locks = createLockClient(pooled);
      const controller = new AbortController();
      const key = randomKey();
      let ran = false;
      let settled = false;
      const queued = rejection(
        locks.withLock(
          key,
          async () => {
            ran = true;
          },
          { signal: controller.signal },
        ),
      ).finally(() => {
        settled = true;
      });
      controller.abort(new Error('the caller gave up'));
      // The abort settles the call by itself: no statement, no connection is needed for that.
      await turn();
      try {
        expect(settled, 'the call settled while the pool was still full').toBe(true);
      } finally {
        release.open();
      }
      const error = await queued;
      expect(isLockkitError(error) && error.code, String(error)).toBe('ABORTED');
      for (const holder of holders) expect((await holder).executed).toBe(true);
      expect((await locks.withLock(key, async () => 'next')).executed).toBe(true);
      expect(ran).toBe(false);
      expect(await f.observer.locksOn(key)).toEqual([]);
    },
  );
}

const noop = (): void => {};

/**
 * Wraps `base` so that, once armed, its next transaction is observable: `called` gives that
 * executor call's promise as soon as it is made, and its callback stops at its start (with the
 * connection in hand and the executor's first round trip done) until `resume()`; `entered` fires
 * there. Calls made before `arm()` pass through.
 */
function holdingCallbacks<Tx, Session>(base: LockExecutor<Tx, Session>) {
  // A promise inside an object: `open(promise)` alone would wait for it.
  const called = gate<{ promise: Promise<unknown> }>();
  const entered = gate();
  const resumed = gate();
  let armed = false;
  const hold =
    <A extends unknown[], R>(fn: (...args: A) => Promise<R>) =>
    async (...args: A): Promise<R> => {
      entered.open();
      await resumed.promise;
      return fn(...args);
    };
  const executor = Object.create(base) as LockExecutor<Tx, Session>;
  for (const name of ['transaction', 'pipelinedTransaction', 'firstThenBegin'] as const) {
    const call: unknown = base[name];
    if (typeof call !== 'function') continue;
    Object.defineProperty(executor, name, {
      value: (...args: unknown[]): Promise<unknown> => {
        if (!armed) return Reflect.apply(call, base, args) as Promise<unknown>;
        armed = false;
        const fnAt = name === 'transaction' ? 0 : 1;
        const wrappedArgs = args.map((arg, i) =>
          i === fnAt ? hold(arg as (...a: unknown[]) => Promise<unknown>) : arg,
        );
        const promise = Reflect.apply(call, base, wrappedArgs) as Promise<unknown>;
        promise.catch(noop);
        called.open({ promise });
        return promise;
      },
    });
  }
  return {
    executor,
    arm: () => {
      armed = true;
    },
    called: called.promise,
    entered: entered.promise,
    resume: () => resumed.open(),
  };
}
