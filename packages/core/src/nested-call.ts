/**
 * A lockkit call from inside a task, on an executor that has one connection only (a single
 * client, a pool of one): the task holds that connection until it returns, so the inner call
 * would wait for it forever. Adapters refuse such a call at once with `NESTED_CALL`.
 *
 * @packageDocumentation
 */
import { AsyncLocalStorage } from 'node:async_hooks';
import { LockkitError } from './errors.js';

/**
 * Knows, for one executor, whether the current async context runs inside one of its tasks. Only
 * meaningful when the executor has a single connection; with more, every method is free.
 */
export class NestedCallGuard {
  /** One mark per driver handle: two executors over one pool of one see each other's tasks. */
  private static readonly byHandle = new WeakMap<object, AsyncLocalStorage<{ active: boolean }>>();

  private readonly running: AsyncLocalStorage<{ active: boolean }> | undefined;

  /**
   * @param name - the executor's name, for the error message.
   * @param singleConnection - whether the executor has one connection only.
   * @param handle - the driver's pool or client the connection comes from: every guard made for
   *   the same handle shares one mark (Drizzle's transactions and the `sessions` executor it was
   *   given over the same pool).
   */
  constructor(
    private readonly name: string,
    singleConnection: boolean,
    handle?: object,
  ) {
    if (!singleConnection) return;
    let running = handle === undefined ? undefined : NestedCallGuard.byHandle.get(handle);
    if (running === undefined) {
      running = new AsyncLocalStorage();
      if (handle !== undefined) NestedCallGuard.byHandle.set(handle, running);
    }
    this.running = running;
  }

  /**
   * Throws `NESTED_CALL` (a {@link LockkitError}) when called from inside a task of this
   * executor: call it before waiting for the connection.
   */
  check(): void {
    if (this.running?.getStore()?.active !== true) return;
    throw new LockkitError(
      'NESTED_CALL',
      `A lockkit call was made from inside a task running on the ${this.name} executor, whose only connection that task holds: it could never run. Use the task's own handle (ctx.query, or the transaction handle), or give the executor more connections.`,
    );
  }

  /**
   * Runs a task (the callback core gave the executor) marked as holding the connection. The mark
   * is switched off when it settles, so timers the task left behind do not carry it on.
   *
   * Without a single connection this is `fn()` itself: no extra promise on the hot path.
   */
  run<T>(fn: () => Promise<T>): Promise<T> {
    const running = this.running;
    if (running === undefined) return fn();
    return NestedCallGuard.marked(running, fn);
  }

  /**
   * Tasks running under each mark. Node (before its async context frames) propagates an
   * `AsyncLocalStorage` with a hook on every promise the process makes, lockkit's or not, for
   * as long as any storage is enabled: the mark is enabled only while one of its tasks runs.
   */
  private static readonly active = new WeakMap<AsyncLocalStorage<{ active: boolean }>, number>();

  private static async marked<T>(
    running: AsyncLocalStorage<{ active: boolean }>,
    fn: () => Promise<T>,
  ): Promise<T> {
    const active = NestedCallGuard.active;
    active.set(running, (active.get(running) ?? 0) + 1);
    const token = { active: true };
    try {
      return await running.run(token, fn);
    } finally {
      token.active = false;
      const left = (active.get(running) ?? 1) - 1;
      active.set(running, left);
      // Stores of continuations still pending read undefined from here on: none is a task.
      if (left === 0) running.disable();
    }
  }
}
