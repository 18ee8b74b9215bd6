/**
 * What an executor knows about the connection it lent to one operation: whether it died, why, and
 * an `AbortSignal` that says so.
 *
 * @packageDocumentation
 */
import type { QueryFn, TransactionContext } from './executor.js';

/**
 * The fate of one leased connection. Adapters call {@link ConnectionFate.abort} when the driver
 * reports the connection dead, and hand {@link ConnectionFate.signal} to core as the context's
 * `signal`. The `AbortSignal` is made on first read only: most tasks never read it, and making
 * one costs more than the rest of a lock decision's JavaScript.
 *
 * @example
 * ```ts
 * import { ConnectionFate } from '@lockkit/core/adapter';
 * const fate = new ConnectionFate();
 * const context = { get signal() { return fate.signal; } };
 * fate.abort(new Error('Connection ended'));
 * console.log(context.signal.aborted, fate.reason); // true, Error: Connection ended
 * ```
 */
export class ConnectionFate {
  private controller: AbortController | undefined;
  private why: unknown;
  private dead = false;

  /** Whether the connection has been reported dead. */
  get aborted(): boolean {
    return this.dead;
  }

  /** Why the connection is dead (undefined while it lives). */
  get reason(): unknown {
    return this.why;
  }

  /** Reports the connection dead; the first report wins. */
  abort(reason: unknown): void {
    if (this.dead) return;
    this.dead = true;
    this.why = reason;
    this.controller?.abort(reason);
  }

  /** Aborted when the connection dies (already aborted if it has). */
  get signal(): AbortSignal {
    if (!this.controller) {
      this.controller = new AbortController();
      if (this.dead) this.controller.abort(this.why);
    }
    return this.controller.signal;
  }
}

/**
 * The {@link TransactionContext} an adapter hands core for one transaction, its `signal` and
 * `lost` read from the connection's {@link ConnectionFate}. A class, so that those getters live
 * on the prototype: an object literal with accessors costs more to build than the rest of a lock
 * decision's JavaScript. The optional members are assigned after construction when the adapter
 * has them.
 *
 * @example
 * ```ts
 * import { ConnectionFate, FateTransactionContext } from '@lockkit/core/adapter';
 * const fate = new ConnectionFate();
 * const ctx = new FateTransactionContext(async () => [], { name: 'tx' }, fate);
 * ctx.ended = () => false;
 * console.log(ctx.lost, ctx.signal.aborted); // false false
 * ```
 */
export class FateTransactionContext<Tx> implements TransactionContext<Tx> {
  /** See {@link TransactionContext.interrupt}. */
  interrupt?: () => Promise<void>;
  /** See {@link TransactionContext.ended}. */
  ended?: () => boolean | undefined;

  constructor(
    /** Runs SQL inside the transaction. */
    readonly query: QueryFn,
    /** The driver's transaction handle. */
    readonly tx: Tx,
    private readonly fate: ConnectionFate,
  ) {}

  /** Aborted when the connection dies. */
  get signal(): AbortSignal {
    return this.fate.signal;
  }

  /** Whether the connection has died. */
  get lost(): boolean {
    return this.fate.aborted;
  }
}
