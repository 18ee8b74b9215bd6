import { describe, expect, it } from 'vitest';
import type { LockExecutor } from './executor.js';
import { tokenEpoch } from './lease.js';
import { createLockClient } from './lock.js';

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

describe('tokenEpoch', () => {
  const epoch = (n: bigint) => n << 40n;
  it('reads the epoch from the bits above the 40 that count claims', () => {
    expect(tokenEpoch(0n)).toBe(0);
    expect(tokenEpoch(41n)).toBe(0); // a token issued before tokens had epochs
    expect(tokenEpoch(epoch(1n) - 1n)).toBe(0);
    expect(tokenEpoch(epoch(1n))).toBe(1); // the first claim on timeline 1
    expect(tokenEpoch(epoch(2n) + 5n)).toBe(2);
    expect(tokenEpoch(2n ** 63n - 1n)).toBe(2 ** 23 - 1); // the largest int8
  });

  it('orders tokens by epoch first: any token of a later epoch is greater', () => {
    const lastOfTimeline1 = epoch(2n) - 1n;
    expect(epoch(2n)).toBeGreaterThan(lastOfTimeline1);
    expect(tokenEpoch(lastOfTimeline1)).toBeLessThan(tokenEpoch(epoch(2n)));
  });

  it('refuses what is not a token', () => {
    expect(() => tokenEpoch(-1n)).toThrow(expect.objectContaining({ code: 'OPTION_INVALID' }));
    expect(() => tokenEpoch(3 as unknown as bigint)).toThrow(
      expect.objectContaining({ code: 'OPTION_INVALID' }),
    );
  });
});
