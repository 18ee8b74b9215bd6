/**
 * The transaction status PostgreSQL sends with every ReadyForQuery message — `'I'` idle, `'T'`
 * inside a transaction block, `'E'` inside a failed one — as drivers that keep it report it
 * (node-postgres: `client.getTransactionStatus()`, which Knex, Kysely and TypeORM connections on
 * node-postgres expose too).
 */

/** A connection whose driver keeps the last ReadyForQuery status. */
export interface ReadyStatusSource {
  getTransactionStatus?(): string | null;
}

/** Whether a ReadyForQuery status says the connection is inside a transaction block (open or failed). */
export function inTransactionBlock(status: string | null | undefined): boolean {
  return status === 'T' || status === 'E';
}

/**
 * A session context's `inTransaction`, read from the driver's last ReadyForQuery status, to spread
 * into the context; nothing when the driver does not keep the status (core then asks the server).
 */
export function inTransactionFrom(source: ReadyStatusSource | null | undefined): {
  readonly inTransaction?: () => boolean;
} {
  if (typeof source?.getTransactionStatus !== 'function') return {};
  return { inTransaction: () => inTransactionBlock(source.getTransactionStatus?.()) };
}
