import { afterEach, describe, expect, it, vi } from 'vitest';
import { BackendWatch } from './backend-watch.js';
import { ConnectionFate } from './connection-fate.js';
import { isConnectionLoss } from './connection-loss.js';

describe('BackendWatch', () => {
  it('aborts the fate of a backend the server no longer has, and only that one', async () => {
    const asked: unknown[][] = [];
    const watch = new BackendWatch(async (_text, params) => {
      asked.push([...params]);
      return [{ pid: 12 }];
    });
    const gone = { pid: 12, fate: new ConnectionFate() };
    const alive = { pid: 13, fate: new ConnectionFate() };
    const stops = [
      watch.add(gone),
      watch.add(alive),
      watch.add({ pid: undefined, fate: new ConnectionFate() }),
    ];
    await watch.check();
    expect(asked).toEqual([[[12, 13]]]);
    expect(gone.fate.aborted).toBe(true);
    expect(isConnectionLoss(gone.fate.reason)).toBe(true);
    expect(alive.fate.aborted).toBe(false);
    for (const stop of stops) stop();
    await watch.check();
    expect(asked).toHaveLength(1);
  });

  it('asks again briefly when nothing is gone yet (a backend exits a moment late)', async () => {
    let calls = 0;
    const watch = new BackendWatch(async () => (++calls < 3 ? [] : [{ pid: 5 }]));
    const lease = { pid: 5, fate: new ConnectionFate() };
    watch.add(lease);
    await watch.check();
    expect(calls).toBe(3);
    expect(lease.fate.aborted).toBe(true);
  });

  it('a check asks only about the leases of its start, and a later lease never waits for it', async () => {
    // A connection closed while lease `before` was watched; lease `after` got its connection
    // afterwards (on a pool of one: the only one). Asking about `after`, or holding its queries
    // until the check settles, would wait for the connection `after` holds: a deadlock.
    const asked: unknown[][] = [];
    const before = { pid: 5, fate: new ConnectionFate() };
    const after = { pid: 7, fate: new ConnectionFate() };
    let stopBefore = () => {};
    let afterWaits: Promise<void> | undefined;
    const watch = new BackendWatch(async (_text, params) => {
      asked.push([...params]);
      if (asked.length === 1) {
        watch.add(after);
        afterWaits = watch.settled(after);
        stopBefore(); // its call settled (its COMMIT failed with the lost link)
      }
      return [];
    });
    stopBefore = watch.add(before);
    expect(watch.settled(before)).toBeUndefined();
    const checking = watch.check();
    expect(watch.settled(before)).toBe(checking);
    await checking;
    expect(afterWaits).toBeUndefined();
    expect(asked).toEqual([[[5]]]);
    expect(after.fate.aborted).toBe(false);
  });

  it('a close during a check is checked again with the leases watched then', async () => {
    const asked: unknown[][] = [];
    const first = { pid: 5, fate: new ConnectionFate() };
    const second = { pid: 7, fate: new ConnectionFate() };
    const watch = new BackendWatch(async (_text, params) => {
      asked.push([...params]);
      if (asked.length === 1) {
        watch.add(second);
        void watch.check(); // second's connection closed while the first check ran
        return [{ pid: 5 }];
      }
      return [{ pid: 7 }];
    });
    watch.add(first);
    await watch.check();
    expect(asked).toEqual([[[5]], [[7]]]);
    expect(first.fate.aborted).toBe(true);
    expect(second.fate.aborted).toBe(true);
  });

  it('the round a close during a check adds is for the leases watched at that close, not for later ones', async () => {
    // Through PgBouncer a cut link's server backend lives on in the pooler's pool: the check after
    // the cut finds nothing gone and asks again a moment later. A second close in that window adds
    // a round. Lease `later` got its connection after that close (on a pool of one: the only one):
    // asking about it, or holding its queries until the check settles, would wait for the
    // connection it holds — the stall of a scheduler tick through PgBouncer after a cut link.
    const asked: unknown[][] = [];
    const first = { pid: 5, fate: new ConnectionFate() };
    const second = { pid: 7, fate: new ConnectionFate() };
    const later = { pid: 9, fate: new ConnectionFate() };
    const laterWaited: boolean[] = [];
    const secondWaits: boolean[] = [];
    let stopFirst = () => {};
    const watch = new BackendWatch(async (_text, params) => {
      asked.push([...params]);
      laterWaited.push(watch.settled(later) !== undefined);
      if (asked.length === 1) {
        const stopSecond = watch.add(second);
        secondWaits.push(watch.settled(second) !== undefined);
        void watch.check(); // second's connection closed while the first check ran
        // Its connection may be the one that closed: its queries wait for the check.
        secondWaits.push(watch.settled(second) !== undefined);
        // Both calls settled with their lost links; then the next call got the connection.
        stopFirst();
        stopSecond();
        watch.add(later);
        laterWaited.push(watch.settled(later) !== undefined);
      }
      return [];
    });
    stopFirst = watch.add(first);
    await watch.check();
    expect(asked).toEqual([[[5]]]);
    expect(secondWaits).toEqual([false, true]);
    expect(laterWaited).toEqual([false, false]);
    expect(watch.settled(later)).toBeUndefined();
  });

  it("a failed check aborts every lease with onCheckFailure 'abort', none by default", async () => {
    const down = new Error('server unreachable');
    const strict = new BackendWatch(async () => Promise.reject(down), { onCheckFailure: 'abort' });
    const lenient = new BackendWatch(async () => Promise.reject(down));
    const a = { pid: 1, fate: new ConnectionFate() };
    const b = { pid: 1, fate: new ConnectionFate() };
    strict.add(a);
    lenient.add(b);
    await strict.check();
    await lenient.check();
    expect(a.fate.reason).toBe(down);
    expect(b.fate.aborted).toBe(false);
  });
});

describe('BackendWatch when the question is never answered', () => {
  afterEach(() => {
    vi.useRealTimers();
  });

  it('a check settles after checkTimeoutMs as a failed one, and the next check asks again', async () => {
    vi.useFakeTimers();
    const asked: number[] = [];
    // The first question never settles (a pool whose reconnect the server refused); later ones
    // are answered: nobody gone.
    const watch = new BackendWatch(
      async () => {
        asked.push(asked.length);
        if (asked.length === 1) return new Promise<never>(() => {});
        return [];
      },
      { onCheckFailure: 'abort', checkTimeoutMs: 1000 },
    );
    const lenient = new BackendWatch(async () => new Promise<never>(() => {}), {
      checkTimeoutMs: 1000,
    });
    const a = { pid: 7, fate: new ConnectionFate() };
    const b = { pid: 8, fate: new ConnectionFate() };
    watch.add(a);
    lenient.add(b);
    let settled = false;
    void watch.check().then(() => {
      settled = true;
    });
    void lenient.check();
    await vi.advanceTimersByTimeAsync(999);
    expect(settled, 'still waiting before the bound').toBe(false);
    expect(watch.settled(a), 'queries on the lease wait meanwhile').toBeDefined();
    await vi.advanceTimersByTimeAsync(1);
    expect(settled, 'settled at the bound').toBe(true);
    expect(watch.settled(a), 'queries no longer wait').toBeUndefined();
    expect((a.fate.reason as { code?: string }).code).toBe('CONNECTION_CHECK_TIMEOUT');
    expect(lenient.settled(b)).toBeUndefined();
    expect(b.fate.aborted, "onCheckFailure 'ignore': the lease goes on").toBe(false);
    // Not stuck on the unanswered question: a later check asks again.
    const c = { pid: 9, fate: new ConnectionFate() };
    watch.add(c);
    const again = watch.check();
    await vi.advanceTimersByTimeAsync(300); // its round asks 3 times (0, 50, 200 ms)
    await again;
    expect(asked).toEqual([0, 1, 2, 3]);
    expect(c.fate.aborted).toBe(false);
  });
});

describe('BackendWatch while the pool is busy', () => {
  afterEach(() => {
    vi.useRealTimers();
  });

  /** A question through the pool that waits for a free connection until `free` is called. */
  function busyPool() {
    let free = () => {};
    const asked: unknown[][] = [];
    const run = (_text: string, params: readonly unknown[]) => {
      asked.push([...params]);
      return new Promise<unknown>((resolve) => {
        free = () => resolve([]);
      });
    };
    return { run, asked, free: () => free() };
  }

  it('probes each watched connection itself when the question through the pool still waits at the next tick', async () => {
    vi.useFakeTimers();
    const pool = busyPool();
    const watch = new BackendWatch(pool.run, { intervalMs: 100 });
    const lost = Object.assign(new Error('Client was closed and is not queryable'), {});
    const probes: string[] = [];
    const dead = {
      pid: 5,
      fate: new ConnectionFate(),
      probe: () => {
        probes.push('dead');
        return Promise.reject(lost);
      },
    };
    const failedTx = {
      pid: 6,
      fate: new ConnectionFate(),
      probe: () => {
        probes.push('failed');
        // A transaction a failed statement aborted refuses every statement: not a lost connection.
        return Promise.reject(
          Object.assign(new Error('current transaction is aborted'), { code: '25P02' }),
        );
      },
    };
    const live = {
      pid: 7,
      fate: new ConnectionFate(),
      probe: () => {
        probes.push('live');
        return Promise.resolve([{ '?column?': 1 }]);
      },
    };
    const unprobed = { pid: 8, fate: new ConnectionFate() };
    for (const backend of [dead, failedTx, live, unprobed]) watch.add(backend);
    await vi.advanceTimersByTimeAsync(100);
    // The first tick asks through the pool, and probes nothing.
    expect(pool.asked).toEqual([[[5, 6, 7, 8]]]);
    expect(probes).toEqual([]);
    await vi.advanceTimersByTimeAsync(100);
    // The question still waits for a connection: each watched connection is probed instead.
    expect(pool.asked).toHaveLength(1);
    expect(probes).toEqual(['dead', 'failed', 'live']);
    expect(dead.fate.reason).toBe(lost);
    expect([failedTx, live, unprobed].map((b) => b.fate.aborted)).toEqual([false, false, false]);
    await vi.advanceTimersByTimeAsync(100);
    // The dead one is not probed again; the others are, while the question waits.
    expect(probes).toEqual(['dead', 'failed', 'live', 'failed', 'live']);
    pool.free();
    await vi.advanceTimersByTimeAsync(100);
    // Answered: the next tick asks through the pool again, and probes nothing.
    expect(pool.asked).toEqual([[[5, 6, 7, 8]], [[6, 7, 8]]]);
    expect(probes).toHaveLength(5);
    watch.add({ pid: 9, fate: new ConnectionFate() })();
  });

  it('never has two probes of one connection under way', async () => {
    vi.useFakeTimers();
    const pool = busyPool();
    const watch = new BackendWatch(pool.run, { intervalMs: 100 });
    let probes = 0;
    let answer = () => {};
    const slow = {
      pid: 5,
      fate: new ConnectionFate(),
      // Queued behind the task's own long statement on its connection.
      probe: () => {
        probes += 1;
        return new Promise<void>((resolve) => {
          answer = resolve;
        });
      },
    };
    const stop = watch.add(slow);
    await vi.advanceTimersByTimeAsync(300);
    expect(probes).toBe(1);
    answer();
    await vi.advanceTimersByTimeAsync(100);
    expect(probes).toBe(2);
    stop();
  });
});

describe('isConnectionLoss', () => {
  it('knows every driver spelling of a lost connection, and nothing else', () => {
    for (const lost of [
      { code: '57P01' },
      { code: '08006' },
      { code: 'ECONNRESET' },
      { code: 'CONNECTION_CLOSED' },
      { code: 'P1017' },
      new Error('Connection terminated unexpectedly'),
      { code: 'P2010', meta: { driverAdapterError: { cause: { code: '57P01' } } } },
      new Error('wrapped', { cause: { code: 'EPIPE' } }),
    ]) {
      expect(isConnectionLoss(lost), JSON.stringify(lost)).toBe(true);
    }
    for (const statementError of [
      { code: '23505' },
      { code: '25P02' },
      { code: '57014' },
      new Error('duplicate key'),
      undefined,
      'text',
    ]) {
      expect(isConnectionLoss(statementError), JSON.stringify(statementError)).toBe(false);
    }
  });
});
