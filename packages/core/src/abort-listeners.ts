/**
 * At most one `abort` listener of lockkit's on a signal, however many of its calls wait on it.
 *
 * Node's EventTarget compares each new listener with every listener the signal already has, so N
 * calls each listening to one shared signal cost O(N²) in all: a scheduler whose stop signal
 * every waiting tick listens to, or an application that passes its shutdown signal to every lock
 * call, spends most of a millisecond per new call once 80,000 wait, and falls further behind the
 * more it falls behind. Here a signal gets one listener, and the calls a set of callbacks behind it.
 *
 * @packageDocumentation
 */

/** One call's interest in a signal: its callback, until it forgets it. */
interface Waiter {
  readonly onAbort: () => void;
}

/** The callbacks behind each signal's one listener, in the order they were added. */
const waiting = new WeakMap<AbortSignal, Set<Waiter>>();

/**
 * Calls `onAbort` once when `signal` aborts — at once (synchronously) if it has already — unless
 * the returned function is called first. Callbacks run in the order they were added; one that
 * throws does not keep the others from running (its error is rethrown on its own, as an
 * EventTarget listener's would be).
 */
export function whenAborted(signal: AbortSignal, onAbort: () => void): () => void {
  if (signal.aborted) {
    onAbort();
    return () => {};
  }
  const waiters = waiting.get(signal) ?? listen(signal);
  const waiter: Waiter = { onAbort };
  waiters.add(waiter);
  return () => {
    waiters.delete(waiter);
  };
}

/** Gives `signal` its one listener, which calls every callback behind it; returns their set. */
function listen(signal: AbortSignal): Set<Waiter> {
  const waiters = new Set<Waiter>();
  waiting.set(signal, waiters);
  signal.addEventListener(
    'abort',
    () => {
      waiting.delete(signal);
      for (const waiter of waiters) {
        try {
          waiter.onAbort();
        } catch (error) {
          queueMicrotask(() => {
            throw error;
          });
        }
      }
      waiters.clear();
    },
    { once: true },
  );
  return waiters;
}
