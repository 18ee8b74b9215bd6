import { afterEach, describe, expect, it, vi } from 'vitest';
import type { LockExecutor } from './executor.js';
import { type ClaimedLease, Heartbeat, holdLease, leaseSettings, tokenParts } from './lease.js';
import { createLockClient } from './lock.js';
import { MAX_TIMEOUT_MS } from './sql/locks.js';

// Option checks happen before any SQL: an executor that throws on use proves nothing was sent.
const unreachable = (): never => {
  throw new Error('no SQL may be sent');
};
const executor: LockExecutor = { name: 'unreachable', transaction: unreachable };
const locks = createLockClient(executor);
const task = async () => 1;

describe('runWithLease option checks', () => {
  it.each([
    ['a tiny ttl', { ttlMs: 10 }],
    ['a fractional ttl', { ttlMs: 1000.5 }],
    ['renewals slower than the ttl allows', { ttlMs: 1000, renewEveryMs: 1000 }],
    ['a margin as long as the ttl', { ttlMs: 1000, safetyMarginMs: 1000 }],
    ['an empty owner', { owner: '' }],
    ['a non-boolean heartbeat', { heartbeat: 'no' as unknown as boolean }],
    ['a non-signal', { signal: {} as AbortSignal }],
  ])('refuses %s with OPTION_INVALID', async (_label, options) => {
    await expect(locks.runWithLease('ns', 'job', task, options)).rejects.toMatchObject({
      code: 'OPTION_INVALID',
    });
  });

  it.each([
    ['null', null],
    ['a string', 'fast'],
    ['a number', 42],
    ['an array', ['ttlMs']],
  ])('refuses options that are %s with OPTION_INVALID', async (_label, options) => {
    await expect(
      locks.runWithLease('ns', 'job', task, options as unknown as undefined),
    ).rejects.toMatchObject({ code: 'OPTION_INVALID' });
  });

  it('rejects an already-aborted signal with ABORTED, its reason as the cause', async () => {
    const controller = new AbortController();
    const reason = new Error('shutting down');
    controller.abort(reason);
    const error = await locks
      .runWithLease('ns', 'job', task, { signal: controller.signal })
      .catch((e: unknown) => e);
    expect(error).toMatchObject({ name: 'LockkitError', code: 'ABORTED', cause: reason });
  });

  it('refuses bad names and tasks with typed errors', async () => {
    await expect(locks.runWithLease('', 'job', task)).rejects.toMatchObject({ code: 'KEY_EMPTY' });
    await expect(
      locks.runWithLease('ns', 'job', 'task' as unknown as typeof task),
    ).rejects.toMatchObject({ code: 'OPTION_INVALID' });
  });

  it('validates the schema when the client is made', () => {
    expect(() => createLockClient(executor, { schema: 'bad-name' })).toThrow(
      expect.objectContaining({ code: 'OPTION_INVALID' }),
    );
    expect(() => createLockClient(executor, { schema: 'jobs_2' })).not.toThrow();
  });
});

describe('tokenParts', () => {
  /** The token of claim `sequence` on `timeline`, generation `generation`. */
  const token = (generation: bigint, timeline: bigint, sequence: bigint) =>
    (generation << 56n) | (timeline << 36n) | sequence;

  it('takes a token apart: generation, timeline, claims counted on it', () => {
    expect(tokenParts(0n)).toEqual({ generation: 0, timeline: 0, sequence: 0 });
    // Issued before tokens carried timelines: a plain count.
    expect(tokenParts(41n)).toEqual({ generation: 0, timeline: 0, sequence: 41 });
    expect(tokenParts(1n << 36n)).toEqual({ generation: 0, timeline: 1, sequence: 0 });
    expect(tokenParts(token(3n, 2n, 5n))).toEqual({ generation: 3, timeline: 2, sequence: 5 });
    expect(tokenParts(2n ** 63n - 1n)).toEqual({
      generation: 127,
      timeline: 2 ** 20 - 1,
      sequence: 2 ** 36 - 1,
    });
  });

  it('orders as the number does: generation, then timeline, then sequence', () => {
    const lastOfTimeline1 = token(0n, 1n, 2n ** 36n - 1n);
    expect(token(0n, 2n, 0n)).toBeGreaterThan(lastOfTimeline1);
    const lastOfGeneration0 = token(0n, 2n ** 20n - 1n, 2n ** 36n - 1n);
    expect(token(1n, 1n, 0n)).toBeGreaterThan(lastOfGeneration0);
  });

  it('refuses what is not an int8 token', () => {
    for (const bad of [-1n, 2n ** 63n, 3 as unknown as bigint]) {
      expect(() => tokenParts(bad)).toThrow(expect.objectContaining({ code: 'OPTION_INVALID' }));
    }
  });
});

describe('withFencedWrite and a lost connection', () => {
  const lease = { namespace: 'ns', jobKey: 'job', token: 5n };
  const dead = () => new Error('Connection terminated unexpectedly');

  /**
   * An executor whose one transaction fails as told: `begin` rejects before the callback runs,
   * `fence` rejects the first statement, `lost` reports the connection gone; otherwise the fence
   * finds the lease held.
   */
  const fenced = (how: { begin?: Error; fence?: Error; lost?: boolean; later?: Error }) =>
    createLockClient({
      name: 'scripted',
      transaction: async (fn) => {
        if (how.begin) throw how.begin;
        let statements = 0;
        const query = async () => {
          if (how.fence) throw how.fence;
          // `later`: every statement after the fence (the task's own) fails with it.
          if (statements++ > 0 && how.later) throw how.later;
          return [{ valid: 1 }];
        };
        return fn({
          query,
          tx: undefined,
          signal: new AbortController().signal,
          ...(how.lost !== undefined && { lost: how.lost }),
        });
      },
    } satisfies LockExecutor);

  it('rejects CONNECTION_LOST, its driver error as the cause, when BEGIN meets a dead link', async () => {
    const begin = dead();
    const error = await fenced({ begin })
      .withFencedWrite(lease, () => 1)
      .catch((e: unknown) => e);
    expect(error).toMatchObject({ code: 'CONNECTION_LOST', cause: begin });
  });

  it('rejects CONNECTION_LOST when the fence meets a dead link', async () => {
    const error = await fenced({ fence: dead() })
      .withFencedWrite(lease, () => 1)
      .catch((e: unknown) => e);
    expect(error).toMatchObject({ code: 'CONNECTION_LOST' });
  });

  it("rejects CONNECTION_LOST when the task fails because the transaction's connection is gone", async () => {
    const error = await fenced({ lost: true })
      .withFencedWrite(lease, () => Promise.reject(dead()))
      .catch((e: unknown) => e);
    expect(error).toMatchObject({ code: 'CONNECTION_LOST' });
  });

  it("rejects CONNECTION_LOST when the task's statement on the transaction's connection is answered by the server's FATAL before the executor sees the socket close", async () => {
    // pg_terminate_backend from outside, or the task's own: the server sends FATAL 57P01, and the
    // driver may reject the statement before it reports the connection gone (a busy machine, a
    // pooler in between). That statement ran on lockkit's connection: it is lost, not the task's.
    const fatal = Object.assign(new Error('terminating connection due to administrator command'), {
      code: '57P01',
    });
    const error = await fenced({ lost: false, later: fatal })
      .withFencedWrite(lease, (_tx, query) =>
        query('SELECT pg_terminate_backend(pg_backend_pid())'),
      )
      .catch((e: unknown) => e);
    expect(error).toMatchObject({ code: 'CONNECTION_LOST', cause: fatal });
  });

  it("passes the task's own error unchanged while the transaction's connection lives", async () => {
    const own = dead();
    const error = await fenced({ lost: false })
      .withFencedWrite(lease, () => Promise.reject(own))
      .catch((e: unknown) => e);
    expect(error).toBe(own);
  });
});

describe('Heartbeat.stop and a renewal that is never answered', () => {
  afterEach(() => {
    vi.useRealTimers();
  });

  it('resolves at the local deadline instead of waiting for it forever', async () => {
    vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout', 'performance'] });
    // ttl 1000, margin 200: the deadline is 800 ms after the claim was sent.
    const s = leaseSettings({ ttlMs: 1000, safetyMarginMs: 200, renewEveryMs: 100 });
    let renewals = 0;
    const beats = new Heartbeat(
      () => {
        renewals++;
        return new Promise<boolean>(() => {}); // the driver lost the request: never answered
      },
      s,
      () => {},
      performance.now(),
    );
    await vi.advanceTimersByTimeAsync(100);
    expect(renewals).toBe(1);
    let stopped = false;
    void beats.stop().then(() => {
      stopped = true;
    });
    await vi.advanceTimersByTimeAsync(650);
    expect(stopped).toBe(false);
    await vi.advanceTimersByTimeAsync(100);
    expect(stopped).toBe(true);
  });

  it('resolves as soon as the renewal in flight is answered', async () => {
    vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout', 'performance'] });
    const s = leaseSettings({ ttlMs: 1000, safetyMarginMs: 200, renewEveryMs: 100 });
    let answer!: (renewed: boolean) => void;
    const beats = new Heartbeat(
      () =>
        new Promise<boolean>((resolve) => {
          answer = resolve;
        }),
      s,
      () => {},
      performance.now(),
    );
    await vi.advanceTimersByTimeAsync(100);
    let stopped = false;
    void beats.stop().then(() => {
      stopped = true;
    });
    await vi.advanceTimersByTimeAsync(10);
    expect(stopped).toBe(false);
    answer(true);
    await vi.advanceTimersByTimeAsync(0);
    expect(stopped).toBe(true);
  });
});

describe('holdLease and a letGoAfterMs beyond what one setTimeout can wait', () => {
  afterEach(() => {
    vi.useRealTimers();
  });

  /** Renewals and the run's record all succeed: every statement finds the lease held. */
  const healthy: LockExecutor = {
    name: 'healthy',
    transaction: (fn) =>
      Promise.resolve(
        fn({
          query: async () => [{ held: true }],
          tx: undefined,
          signal: new AbortController().signal,
        }),
      ),
  };
  const claimed = (): ClaimedLease => ({
    namespace: 'ns',
    jobKey: 'job',
    token: 7n,
    tookOver: false,
    claimSentAt: performance.now(),
  });

  it('keeps the lease of a task that settles long before a letGoAfterMs above 2^31 − 1 ms', async () => {
    vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout', 'performance'] });
    const s = leaseSettings({ ttlMs: 30_000 });
    // What the scheduler passes for a job with the largest timeoutMs: timeoutMs + ttlMs.
    const letGoAfterMs = MAX_TIMEOUT_MS + s.ttlMs;
    let signal: AbortSignal | undefined;
    let finish!: () => void;
    const run = holdLease(
      healthy,
      '"lockkit"',
      claimed(),
      s,
      (lease) => {
        signal = lease.signal;
        return new Promise<string>((resolve) => {
          finish = () => resolve('done');
        });
      },
      { fenced: unreachable, letGoAfterMs },
    );
    await vi.advanceTimersByTimeAsync(60_000);
    expect(signal?.aborted).toBe(false);
    finish();
    await expect(run).resolves.toBe('done');
  });

  it('lets the lease go once the task has run letGoAfterMs, not a millisecond before', async () => {
    vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout', 'performance'] });
    // The longest ttl: few renewals over the weeks of fake time below.
    const s = leaseSettings({ ttlMs: MAX_TIMEOUT_MS });
    const letGoAfterMs = MAX_TIMEOUT_MS + s.ttlMs;
    let signal: AbortSignal | undefined;
    void holdLease(
      healthy,
      '"lockkit"',
      claimed(),
      s,
      (lease) => {
        signal = lease.signal;
        return new Promise<never>(() => {}); // a hung task that ignores its signal
      },
      { fenced: unreachable, letGoAfterMs },
    ).catch(() => {});
    await vi.advanceTimersByTimeAsync(letGoAfterMs - 1);
    expect(signal?.aborted).toBe(false);
    await vi.advanceTimersByTimeAsync(1);
    expect(signal?.aborted).toBe(true);
    expect(signal?.reason).toMatchObject({
      name: 'LeaseLostError',
      message: expect.stringMatching(/let go/),
    });
  });
});

describe('renewEveryMs and the window it must renew in', () => {
  // A renewal is a round trip: sent as late as the deadline, its answer comes after it. The
  // bound is the one a claim is held to: half of ttlMs − safetyMarginMs.
  it.each([
    [{ ttlMs: 1000, safetyMarginMs: 200, renewEveryMs: 800 }],
    [{ ttlMs: 1000, safetyMarginMs: 200, renewEveryMs: 799 }],
    [{ ttlMs: 1000, safetyMarginMs: 0, renewEveryMs: 1000 }],
    [{ ttlMs: 1000, safetyMarginMs: 200, renewEveryMs: 401 }],
  ])('refuses %o before any SQL, naming the three values and the rule', async (options) => {
    const error = await locks.runWithLease('ns', 'job', task, options).catch((e: unknown) => e);
    expect(error).toMatchObject({ name: 'LockkitError', code: 'OPTION_INVALID' });
    const { message } = error as Error;
    expect(message).toContain(`renewEveryMs ${options.renewEveryMs}`);
    expect(message).toContain(`ttlMs ${options.ttlMs}`);
    expect(message).toContain(`safetyMarginMs ${options.safetyMarginMs}`);
    expect(message).toContain('half of ttlMs − safetyMarginMs');
  });

  it('accepts renewEveryMs of exactly half of ttlMs − safetyMarginMs', () => {
    expect(
      leaseSettings({ ttlMs: 1000, safetyMarginMs: 200, renewEveryMs: 400 }).renewEveryMs,
    ).toBe(400);
    expect(leaseSettings({ ttlMs: 1001, safetyMarginMs: 0, renewEveryMs: 500 }).renewEveryMs).toBe(
      500,
    );
  });

  it('defaults to a third of ttlMs, or half the window when a large margin leaves less', () => {
    expect(leaseSettings({ ttlMs: 30_000 }).renewEveryMs).toBe(10_000);
    expect(leaseSettings({ ttlMs: 1000, safetyMarginMs: 500 }).renewEveryMs).toBe(250);
    expect(leaseSettings({ ttlMs: 1000, safetyMarginMs: 998 }).renewEveryMs).toBe(1);
  });

  it('refuses a margin that leaves no window a renewal fits in twice', () => {
    expect(() => leaseSettings({ ttlMs: 1000, safetyMarginMs: 999 })).toThrow(
      expect.objectContaining({ code: 'OPTION_INVALID' }),
    );
  });
});

describe('names and owners PostgreSQL text cannot store', () => {
  it.each([
    ['a NUL in the namespace', 'ns\u0000x', 'job'],
    ['a NUL in the job key', 'ns', 'job\u0000'],
  ])(
    'runWithLease refuses %s with LockKeyError KEY_MALFORMED before any SQL',
    async (_l, ns, jk) => {
      await expect(locks.runWithLease(ns, jk, task)).rejects.toMatchObject({
        name: 'LockKeyError',
        code: 'KEY_MALFORMED',
      });
      await expect(
        locks.withFencedWrite({ namespace: ns, jobKey: jk, token: 1n }, () => 1),
      ).rejects.toMatchObject({ name: 'LockKeyError', code: 'KEY_MALFORMED' });
    },
  );

  it.each([
    ['a NUL', 'worker\u00001'],
    ['a lone surrogate', 'worker\ud800'],
  ])(
    'runWithLease refuses an owner with %s with OPTION_INVALID before any SQL',
    async (_l, owner) => {
      await expect(locks.runWithLease('ns', 'job', task, { owner })).rejects.toMatchObject({
        name: 'LockkitError',
        code: 'OPTION_INVALID',
      });
    },
  );
});
