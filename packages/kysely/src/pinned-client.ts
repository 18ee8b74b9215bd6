/**
 * Which `pg` connection Kysely pinned for a session or a transaction. Kysely keeps its driver's
 * connection private, but lockkit needs it there: its `'end'` and `'error'` events tell at once
 * that the task's connection died (asking the server needs a free connection of the pool, and all
 * may be busy), its startup pid (BackendKeyData) is how a transaction pooler is detected, its
 * transaction status tells whether a task left a transaction open, and it is the one connection to
 * close after a session's task. The pool's `connect` is wrapped once: a call made while lockkit
 * asks (an `AsyncLocalStorage` mark around `db.connection().execute(…)` or
 * `db.transaction().execute(…)`) reports the connection it resolves with. Kysely calls it in that
 * very async context, whether the pool had a connection free or the call queued.
 *
 * @packageDocumentation
 */
import { AsyncLocalStorage } from 'node:async_hooks';

/** What one session asks for: the first connection handed out under its mark. */
interface Ask<C> {
  client: C | undefined;
  /** Set once the session's callback runs: connections asked for from then on are the task's. */
  closed: boolean;
  /** Set once the mark no longer counts in {@link marked}. */
  unmarked: boolean;
}

/** One mark for every pool: a session's store is its own object. */
const asking = new AsyncLocalStorage<Ask<unknown>>();

/** Sessions under a mark now: the mark is switched off when none is (see `NestedCallGuard`). */
let marked = 0;

const wrapped = new WeakSet<object>();

/** A pool whose promise-returning `connect()` can be wrapped. */
export interface ConnectablePool<C> {
  connect(): Promise<C>;
}

/**
 * Wraps `pool.connect` (once per pool) so that {@link takePinned} can tell which connection a call
 * made under a mark got. Calls with a callback, or outside any mark, pass through as they are.
 */
export function watchConnects<C>(pool: ConnectablePool<C>): void {
  if (wrapped.has(pool)) return;
  wrapped.add(pool);
  const connect = pool.connect as (...args: unknown[]) => unknown;
  (pool as { connect: (...args: unknown[]) => unknown }).connect = function (
    this: unknown,
    ...args: unknown[]
  ) {
    const ask = asking.getStore();
    const result = connect.apply(this, args);
    if (ask === undefined || ask.closed || args.length > 0) return result;
    if (typeof (result as PromiseLike<unknown> | undefined)?.then !== 'function') return result;
    return (result as PromiseLike<unknown>).then((client) => {
      ask.client ??= client;
      return client;
    });
  };
}

/**
 * Runs `open` (which makes Kysely pin a connection) under a fresh mark: inside its callback,
 * {@link takePinned} returns the connection the pool handed out for it.
 */
export async function underPinMark<T>(open: () => Promise<T>): Promise<T> {
  marked += 1;
  const ask: Ask<unknown> = { client: undefined, closed: false, unmarked: false };
  try {
    return await asking.run(ask, open);
  } finally {
    unmark(ask);
  }
}

/**
 * Stops counting `ask` among the marks (once). Node hooks every promise of the process while a
 * storage is enabled: it is switched off as soon as no mark still waits for its connection, not
 * when the task ends.
 */
function unmark(ask: Ask<unknown>): void {
  if (ask.unmarked) return;
  ask.unmarked = true;
  marked -= 1;
  if (marked === 0) asking.disable();
}

/**
 * The `pg` connection pinned for the current mark (`undefined` outside one, or when the pool was
 * not wrapped). Closes the mark: connections the task asks for later are not the session's.
 */
export function takePinned<C>(): C | undefined {
  const ask = asking.getStore();
  if (ask === undefined) return undefined;
  ask.closed = true;
  unmark(ask);
  return ask.client as C | undefined;
}
