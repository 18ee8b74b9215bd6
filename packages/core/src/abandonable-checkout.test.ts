import { describe, expect, it } from 'vitest';
import { abandonableCheckout, abandonableWait, type Checkout } from './abandonable-checkout.js';

/** A pool of one whose connection is lent when the test says so. */
function heldPool() {
  let lend!: () => void;
  const lent = new Promise<void>((resolve) => {
    lend = resolve;
  });
  const entered: boolean[] = [];
  const start = (checkout: Checkout) =>
    lent.then(() => {
      const mayGoOn = checkout.enter();
      entered.push(mayGoOn);
      if (!mayGoOn) throw new Error('left before the connection came');
      return 'ran';
    });
  return { lend, entered, start };
}

const aborted = (signal: AbortSignal) => new Error(`aborted: ${String(signal.reason)}`);

describe('abandonableCheckout', () => {
  it('rejects at once when the signal fires during the wait; the late callback is told to leave', async () => {
    const pool = heldPool();
    const controller = new AbortController();
    const call = abandonableCheckout(controller.signal, pool.start, aborted);
    controller.abort('gave up');
    await expect(call).rejects.toThrow('aborted: gave up');
    expect(pool.entered).toEqual([]); // still waiting for the connection
    pool.lend();
    await new Promise((r) => setImmediate(r));
    expect(pool.entered).toEqual([false]);
  });

  it('leaves an abort after entry to the call itself', async () => {
    const controller = new AbortController();
    let release!: (value: string) => void;
    const call = abandonableCheckout(
      controller.signal,
      (checkout) =>
        new Promise<string>((resolve) => {
          expect(checkout.enter()).toBe(true);
          release = resolve;
        }),
      aborted,
    );
    controller.abort('late');
    release('answered by the call');
    await expect(call).resolves.toBe('answered by the call');
  });

  it('an already aborted signal rejects without waiting; no signal is a plain call', async () => {
    const controller = new AbortController();
    controller.abort('before');
    const pool = heldPool();
    await expect(abandonableCheckout(controller.signal, pool.start, aborted)).rejects.toThrow(
      'aborted: before',
    );
    const plain = heldPool();
    const call = abandonableCheckout(undefined, plain.start, aborted);
    plain.lend();
    await expect(call).resolves.toBe('ran');
    pool.lend();
    await new Promise((r) => setImmediate(r));
    expect([pool.entered, plain.entered]).toEqual([[false], [true]]);
  });
});

describe('abandonableWait', () => {
  const deferred = () => {
    let resolve!: (value: string) => void;
    let reject!: (error: Error) => void;
    const promise = new Promise<string>((res, rej) => {
      resolve = res;
      reject = rej;
    });
    return { promise, resolve, reject };
  };

  it('rejects at once when the signal fires; the shared wait goes on for its other callers', async () => {
    const shared = deferred();
    const controller = new AbortController();
    const left = abandonableWait(controller.signal, shared.promise, aborted);
    const stayed = abandonableWait(new AbortController().signal, shared.promise, aborted);
    controller.abort('gave up');
    await expect(left).rejects.toThrow('aborted: gave up');
    shared.resolve('verdict');
    await expect(stayed).resolves.toBe('verdict');
  });

  it('a wait that fails after its caller left is not an unhandled rejection', async () => {
    const shared = deferred();
    const controller = new AbortController();
    const left = abandonableWait(controller.signal, shared.promise, aborted);
    controller.abort('gave up');
    await expect(left).rejects.toThrow('aborted: gave up');
    const unhandled: unknown[] = [];
    const onUnhandled = (reason: unknown) => unhandled.push(reason);
    process.on('unhandledRejection', onUnhandled);
    try {
      shared.reject(new Error('the self-test failed'));
      await new Promise((resolve) => setImmediate(resolve));
      await new Promise((resolve) => setImmediate(resolve));
      expect(unhandled).toEqual([]);
    } finally {
      process.off('unhandledRejection', onUnhandled);
    }
  });

  it('settles as the wait does when the signal never fires, or there is none', async () => {
    const shared = deferred();
    const call = abandonableWait(new AbortController().signal, shared.promise, aborted);
    shared.reject(new Error('no server'));
    await expect(call).rejects.toThrow('no server');
    const plain = Promise.resolve('ok');
    expect(abandonableWait(undefined, plain, aborted)).toBe(plain);
    const already = new AbortController();
    already.abort('before');
    await expect(abandonableWait(already.signal, deferred().promise, aborted)).rejects.toThrow(
      'aborted: before',
    );
  });
});
