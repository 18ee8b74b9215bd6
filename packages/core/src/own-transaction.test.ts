import { describe, expect, it } from 'vitest';
import { isLockkitError } from './errors.js';
import type { LockExecutor, QueryFn } from './executor.js';
import { ownTransaction } from './own-transaction.js';

/** node-postgres's error for a socket that closed under a query: no SQLSTATE, only a message. */
const socketClosed = () => new Error('Connection terminated unexpectedly');

/**
 * An executor whose transaction runs the body with a query that answers, or fails with `onQuery`,
 * then fails with `onCommit` (when given) as a COMMIT would.
 */
function executor(options: {
  readonly onQuery?: () => Error;
  readonly onCommit?: () => Error;
}): Pick<LockExecutor<unknown, unknown>, 'transaction'> {
  return {
    transaction: async (fn) => {
      const query: QueryFn = async () => {
        if (options.onQuery) throw options.onQuery();
        return [{ one: 1 }];
      };
      const result = await fn({ query, tx: undefined, signal: new AbortController().signal });
      if (options.onCommit) throw options.onCommit();
      return result;
    },
  };
}

const codeOf = async (promise: Promise<unknown>) => {
  const error = await promise.then(
    () => undefined,
    (e: unknown) => e,
  );
  return isLockkitError(error) ? error.code : error;
};

describe('ownTransaction', () => {
  it('returns what the body returns', async () => {
    const rows = await ownTransaction(executor({}), 'test', (query) => query('SELECT 1'));
    expect(rows).toEqual([{ one: 1 }]);
  });

  it('types a connection lost under a statement CONNECTION_LOST', async () => {
    const run = ownTransaction(executor({ onQuery: socketClosed }), 'test', (q) => q('SELECT 1'));
    expect(await codeOf(run)).toBe('CONNECTION_LOST');
  });

  it('types a terminated backend (57P01) CONNECTION_LOST', async () => {
    const terminated = () => Object.assign(new Error('terminating connection'), { code: '57P01' });
    const run = ownTransaction(executor({ onQuery: terminated }), 'test', (q) => q('SELECT 1'));
    expect(await codeOf(run)).toBe('CONNECTION_LOST');
  });

  it('types a connection lost once only COMMIT was left COMMIT_OUTCOME_UNKNOWN', async () => {
    const run = ownTransaction(executor({ onCommit: socketClosed }), 'test', (q) => q('SELECT 1'));
    expect(await codeOf(run)).toBe('COMMIT_OUTCOME_UNKNOWN');
  });

  it('types a COMMIT that failed on a live connection COMMIT_ROLLED_BACK', async () => {
    const deferred = () => Object.assign(new Error('violates constraint'), { code: '23505' });
    const run = ownTransaction(executor({ onCommit: deferred }), 'test', (q) => q('SELECT 1'));
    expect(await codeOf(run)).toBe('COMMIT_ROLLED_BACK');
  });

  it("passes a statement's own Postgres error it gives no meaning unchanged", async () => {
    const denied = Object.assign(new Error('permission denied'), { code: '42501' });
    const run = ownTransaction(executor({ onQuery: () => denied }), 'test', (q) =>
      q('CREATE TABLE t ()'),
    );
    expect(await codeOf(run)).toBe(denied);
  });
});
