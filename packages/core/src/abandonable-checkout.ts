/**
 * A call's wait for a pooled connection, ended by its `signal`.
 *
 * Every lock call first asks its executor for a connection. When the pool is exhausted that ask
 * waits, and drivers give no way to withdraw it: a caller who aborts must not be kept waiting
 * for a connection it no longer wants. So the call rejects at once with the abort, and the ask
 * stays queued. When the pool lends the connection later, the call's callback finds the caller
 * gone and throws before it does anything: the executor rolls back and the connection goes back
 * to the pool, clean. Once the callback has started, the call has its connection and answers its
 * signal itself (a lock wait, a task, a release), as before.
 *
 * The same holds for what a call awaits before it asks for a connection of its own (the engine
 * self-test a client's first calls share): {@link abandonableWait}.
 *
 * @packageDocumentation
 */

import { whenAborted } from './abort-listeners.js';

/** What the callback of an executor call is given: whether it may go on. */
export interface Checkout {
  /**
   * Call first thing in the executor's callback. `true`: the connection is this call's, and from
   * here the call answers its signal itself. `false`: the caller left while the call waited for
   * the connection; throw at once, so that the executor rolls back and gives it back.
   */
  enter(): boolean;
}

/**
 * Runs `start` (an executor call whose callback begins with `checkout.enter()`). Rejects with
 * `aborted(signal)` as soon as `signal` fires while the call still waits for its connection; the
 * call itself then settles unobserved, once the pool lends it that connection and it gives it back.
 */
export function abandonableCheckout<T>(
  signal: AbortSignal | undefined,
  start: (checkout: Checkout) => Promise<T>,
  aborted: (signal: AbortSignal) => Error,
): Promise<T> {
  if (signal === undefined) return start({ enter: () => true });
  let entered = false;
  let abandoned = false;
  const run = start({
    enter: () => {
      if (abandoned) return false;
      entered = true;
      return true;
    },
  });
  return new Promise<T>((resolve, reject) => {
    const forget = whenAborted(signal, () => {
      // Past `enter()`, the call has its connection and answers the abort itself.
      if (entered) return;
      abandoned = true;
      run.catch(() => {});
      reject(aborted(signal));
    });
    run.then(
      (value) => {
        forget();
        resolve(value);
      },
      (error: unknown) => {
        forget();
        reject(error);
      },
    );
  });
}

/**
 * A wait the caller may leave: resolves or rejects as `wait` does, unless `signal` fires first;
 * then rejects at once with `aborted(signal)`, and `wait` goes on for whoever else awaits it (its
 * outcome, unobserved here, is not reported as unhandled). For what a call awaits before it asks
 * for a connection of its own, such as the engine self-test that every first call of a client
 * shares, and that itself waits for pooled connections.
 */
export function abandonableWait<T>(
  signal: AbortSignal | undefined,
  wait: Promise<T>,
  aborted: (signal: AbortSignal) => Error,
): Promise<T> {
  if (signal === undefined) return wait;
  return new Promise<T>((resolve, reject) => {
    const forget = whenAborted(signal, () => {
      wait.catch(() => {});
      reject(aborted(signal));
    });
    wait.then(
      (value) => {
        forget();
        resolve(value);
      },
      (error: unknown) => {
        forget();
        reject(error);
      },
    );
  });
}
