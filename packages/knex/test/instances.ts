/**
 * Knex instances for the tests, made as a user would make them.
 */
import knex, { type Knex } from 'knex';
import { knexExecutor } from '../src/index.js';

/** Connections Knex's pool has handed out and not yet got back. */
export function checkedOut(db: Knex): number {
  const pool = db.client.pool as { numUsed?: () => number } | undefined;
  return pool?.numUsed?.() ?? 0;
}

export function knexInstance(url: string, poolSize: number, transactionPooler = false) {
  // min 0: no idle connection is kept open beyond what the test uses.
  const db = knex({ client: 'pg', connection: url, pool: { min: 0, max: poolSize } });
  return {
    db,
    executor: knexExecutor(db, { transactionPooler }),
    checkedOut: () => checkedOut(db),
    close: () => db.destroy(),
  };
}
