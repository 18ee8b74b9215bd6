/**
 * Listening to event-emitting driver connections (node-postgres) for their whole checked-out life.
 *
 * A `pg.Client` that loses its server emits `'error'`. With no listener, that crashes the process.
 * `pg.Pool` listens only while a client sits idle. Whoever checks one out must listen until it is
 * released. That includes the stretch before lockkit's code runs, such as Drizzle's own `BEGIN`,
 * and the stretch after it, such as the `COMMIT`. So lockkit puts one pair of listeners on each
 * connection and keeps them there. Each pair reports to the connection's current lease, if there
 * is one, and otherwise does nothing: the query that was running fails on its own.
 *
 * @packageDocumentation
 */
import type { ConnectionFate } from './connection-fate.js';

/** What lockkit needs to listen to a node-postgres connection. */
export interface PgEventSourceLike {
  on(event: 'error', listener: (error: Error) => void): unknown;
  on(event: 'end', listener: () => void): unknown;
}

/** A connection's current lease: the fate its listeners report to, while lockkit holds it. */
export interface ConnectionSlot {
  current: ConnectionFate | undefined;
  /** Why the connection died ('error' or 'end' seen), undefined while it lives. */
  lost: unknown;
}

const slots = new WeakMap<PgEventSourceLike, ConnectionSlot>();

/**
 * The slot of `client`. On first use, this adds lockkit's `'error'` and `'end'` listeners, which
 * stay for the connection's life. Adding and removing them on every lock decision cost more than
 * keeping them.
 */
export function slotOf(client: PgEventSourceLike): ConnectionSlot {
  let slot = slots.get(client);
  if (!slot) {
    const created: ConnectionSlot = { current: undefined, lost: undefined };
    client.on('error', (error: Error) => {
      created.lost ??= error;
      created.current?.abort(error);
    });
    client.on('end', () => {
      const ended = new Error('Connection ended');
      created.lost ??= ended;
      created.current?.abort(ended);
    });
    slots.set(client, created);
    slot = created;
  }
  return slot;
}

/** What {@link guardCheckouts} needs of a `pg.Pool`: its `'acquire'` event. */
export interface PgPoolEventsLike {
  on(event: 'acquire', listener: (client: PgEventSourceLike) => void): unknown;
}

const guarded = new WeakSet<object>();

/**
 * Gives every client that `pool` hands out its slot, and so lockkit's listeners. This happens at
 * checkout, before anyone sends a statement on the client. It is for adapters whose ORM checks
 * connections out itself, such as Drizzle's transactions. Calling it again for the same pool
 * does nothing.
 */
export function guardCheckouts(pool: PgPoolEventsLike): void {
  if (guarded.has(pool)) return;
  guarded.add(pool);
  pool.on('acquire', (client) => {
    slotOf(client);
  });
}
