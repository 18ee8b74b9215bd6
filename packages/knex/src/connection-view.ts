/**
 * The connection Knex's transaction is given: the node-postgres client lockkit checked out, seen
 * through a view that lets lockkit ride on Knex's own `BEGIN;` and read Knex's own `COMMIT;`.
 *
 * Knex runs a transaction's statements with `connection.query({ text, values }, callback)`. The
 * view changes nothing else: it rewrites the transaction's first `BEGIN;` into `BEGIN; <opening>`
 * (or `<opening>; BEGIN`), one simple-protocol query with several statements, so that core's
 * first statement costs no round trip of its own; it remembers whether `COMMIT;` answered
 * `ROLLBACK`; and it follows every command tag, so that lockkit knows when the task ended the
 * transaction itself.
 *
 * @packageDocumentation
 */
import type { Row } from '@lockkit/core';

/** The part of a node-postgres query result lockkit reads. */
export interface PgQueryResultLike {
  readonly rows?: Row[];
  /** The command tag: `'COMMIT'`, `'ROLLBACK'`, `'SELECT'`, … */
  readonly command?: string | null;
}

/**
 * The part of the node-postgres client (`pg.Client`) that Knex's `pg` dialect hands out, that
 * lockkit uses. Declared structurally: this package does not depend on `pg` or `@types/pg`.
 */
export interface KnexPgConnection {
  /** The backend pid from the server's BackendKeyData at connect. */
  readonly processID?: number | null;
  /** BackendKeyData's secret key, for the protocol's CancelRequest. */
  readonly secretKey?: number | null;
  /** The server the client connected to (a host name, or a Unix socket directory). */
  readonly host?: string;
  readonly port?: number;
  /** The transaction status of the last ReadyForQuery: `'I'` idle, `'T'` open, `'E'` failed. */
  getTransactionStatus?(): string | null;
  query(text: string, values?: unknown[]): Promise<PgQueryResultLike | PgQueryResultLike[]>;
  on(event: 'error', listener: (error: Error) => void): unknown;
  on(event: 'end', listener: () => void): unknown;
}

/** How the view sends Knex's `BEGIN;`. */
export type Opening =
  | { readonly kind: 'plain' }
  /** `BEGIN; <text>`: the rows of `text` are the last result's. */
  | { readonly kind: 'after-begin'; readonly text: string }
  /** `<text>; BEGIN`: the rows of `text` are the first result's. */
  | { readonly kind: 'before-begin'; readonly text: string };

type Callback = (error: Error | null, result: unknown) => void;

/** The exact statements Knex's pg dialect sends (lib/execution/transaction.js, pg-transaction.js). */
const KNEX_BEGIN = 'BEGIN;';
const KNEX_COMMIT = 'COMMIT;';

function resultsOf(result: unknown): PgQueryResultLike[] {
  if (Array.isArray(result)) return result as PgQueryResultLike[];
  return typeof result === 'object' && result !== null ? [result as PgQueryResultLike] : [];
}

/**
 * One transaction's view of its connection. Make one per transaction, pass {@link view} to
 * `knex.transaction(…, { connection })`, and send lockkit's own statements through
 * {@link TransactionView.observe} so they are followed too.
 */
export class TransactionView {
  /** The connection as Knex sees it. */
  readonly view: KnexPgConnection;
  /** Whether the opening statement went with Knex's BEGIN; its rows then. */
  openingSent = false;
  openingRows: Row[] = [];
  /**
   * The error of Knex's `BEGIN;` (with the opening, when it went along), if it failed. Knex then
   * rejects its transaction but still calls the transaction's callback: the callback must check.
   */
  beginError: Error | undefined;
  /** Whether Knex's COMMIT; was answered ROLLBACK (the transaction had failed). */
  commitAnsweredRollback = false;
  /**
   * Whether the transaction has ended since BEGIN: `false` until a command says so, `true` after
   * COMMIT (and COMMIT AND CHAIN), PREPARE TRANSACTION or an idle ReadyForQuery, `undefined`
   * once a ROLLBACK tag (perhaps only ROLLBACK TO SAVEPOINT) or an error leaves it unclear.
   */
  private state: boolean | undefined = false;
  private begun = false;

  constructor(
    private readonly connection: KnexPgConnection,
    private readonly opening: Opening,
  ) {
    const query = (...args: unknown[]): unknown => this.query(args);
    this.view = new Proxy(connection, {
      get: (target, property, receiver) =>
        property === 'query' ? query : Reflect.get(target, property, receiver),
    });
  }

  /** `ctx.ended`: see {@link TransactionContext.ended} in `@lockkit/core`. */
  readonly ended = (): boolean | undefined => this.state;

  /** Records what a statement of the transaction answered (its result, or that it failed). */
  observe(result: unknown, failed: boolean): void {
    if (!this.begun) return;
    if (failed) {
      if (this.state === false) this.state = undefined;
      return;
    }
    for (const { command } of resultsOf(result)) {
      if (command === 'COMMIT' || command === 'PREPARE TRANSACTION') this.state = true;
      else if (command === 'ROLLBACK' && this.state === false) this.state = undefined;
    }
    if (this.connection.getTransactionStatus?.() === 'I') this.state = true;
  }

  private query(args: unknown[]): unknown {
    const [config, callback] = args as [{ text?: unknown } | undefined, unknown];
    const target = this.connection as unknown as { query(...a: unknown[]): unknown };
    if (typeof callback !== 'function' || typeof config?.text !== 'string') {
      return target.query(...args);
    }
    const done = callback as Callback;
    const text = config.text;
    if (!this.begun && text === KNEX_BEGIN) {
      this.begun = true;
      const { opening } = this;
      const begun = (error: Error | null) => {
        if (error) this.beginError = error;
      };
      if (opening.kind === 'plain') {
        return target.query(config, (error: Error | null, result: unknown) => {
          begun(error);
          done(error, result);
        });
      }
      this.openingSent = true;
      const sent =
        opening.kind === 'after-begin' ? `BEGIN; ${opening.text}` : `${opening.text}; BEGIN`;
      return target.query({ ...config, text: sent }, (error: Error | null, result: unknown) => {
        begun(error);
        if (!error) {
          const results = resultsOf(result);
          const rows = (opening.kind === 'after-begin' ? results.at(-1) : results[0])?.rows;
          this.openingRows = rows ?? [];
        }
        done(error, result);
      });
    }
    const committing = text === KNEX_COMMIT && this.state === false;
    return target.query(config, (error: Error | null, result: unknown) => {
      if (committing && !error) {
        this.commitAnsweredRollback = resultsOf(result)[0]?.command === 'ROLLBACK';
      }
      this.observe(result, error !== null);
      done(error, result);
    });
  }
}
