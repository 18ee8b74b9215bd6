/**
 * When a transaction whose connection was dead from the start is begun again: only before
 * lockkit's callback ran, only for a lost connection (not one that never came), and only once.
 */
import { describe, expect, it } from 'vitest';
import { retryDeadStart } from './dead-start.js';
import { ConnectionLostError } from './errors.js';

const withCode = (code: string) => Object.assign(new Error(`failed: ${code}`), { code });

/** A `begin` that fails with `failures` in turn, before or after calling the body, then runs it. */
function beginning(failures: { error: Error; afterBody?: boolean }[]) {
  let attempts = 0;
  const begin = async <T>(body: (ctx: string) => Promise<T>): Promise<T> => {
    const failure = failures[attempts++];
    if (failure === undefined) return body(`connection ${attempts}`);
    if (failure.afterBody) await body(`connection ${attempts}`);
    throw failure.error;
  };
  return { begin, attempts: () => attempts };
}

describe('retryDeadStart', () => {
  it('begins once more when the connection was lost before the body ran', async () => {
    const b = beginning([{ error: withCode('57P01') }]);
    await expect(retryDeadStart(b.begin, async (ctx) => ctx)).resolves.toBe('connection 2');
    expect(b.attempts()).toBe(2);
  });

  it('never begins again once the body ran', async () => {
    const b = beginning([{ error: withCode('57P01'), afterBody: true }]);
    await expect(retryDeadStart(b.begin, async (ctx) => ctx)).rejects.toMatchObject({
      code: '57P01',
    });
    expect(b.attempts()).toBe(1);
  });

  it("passes on a failure that is not a lost connection, a connection that never came, and lockkit's own verdict", async () => {
    const refused = new ConnectionLostError('the adapter refused the connection it was lent');
    for (const error of [
      withCode('42P01'),
      withCode('ECONNREFUSED'),
      withCode('ETIMEDOUT'),
      refused,
    ]) {
      const b = beginning([{ error }]);
      await expect(retryDeadStart(b.begin, async (ctx) => ctx)).rejects.toBe(error);
      expect(b.attempts(), error.message).toBe(1);
    }
  });

  it('begins again only once: a second dead connection is reported', async () => {
    const second = withCode('ECONNRESET');
    const b = beginning([{ error: withCode('57P01') }, { error: second }]);
    await expect(retryDeadStart(b.begin, async (ctx) => ctx)).rejects.toBe(second);
    expect(b.attempts()).toBe(2);
  });
});
