/**
 * A node-postgres connection is ended when one of its queries fails with a lost connection, and
 * only then.
 */
import { describe, expect, it } from 'vitest';
import { endOnLoss } from './end-on-loss.js';

const withCode = (code: string) => Object.assign(new Error(`failed: ${code}`), { code });

/** A client whose queries fail with `error`, counting its ends. */
function failing(error: Error) {
  const client = {
    ends: 0,
    query: (..._args: never[]): Promise<never> => Promise.reject(error),
    end: async () => {
      client.ends++;
    },
  };
  return client;
}

describe('endOnLoss', () => {
  it('ends the connection when a query fails with a lost connection; the caller still hears it', async () => {
    const client = failing(withCode('57P01'));
    endOnLoss(client);
    await expect(client.query()).rejects.toMatchObject({ code: '57P01' });
    expect(client.ends).toBe(1);
  });

  it('leaves the connection open when one statement failed', async () => {
    const client = failing(withCode('42P01'));
    endOnLoss(client);
    await expect(client.query()).rejects.toMatchObject({ code: '42P01' });
    expect(client.ends).toBe(0);
  });

  it('wraps a connection once, however often it is handed over', async () => {
    const client = failing(withCode('ECONNRESET'));
    endOnLoss(client);
    endOnLoss(client);
    await expect(client.query()).rejects.toMatchObject({ code: 'ECONNRESET' });
    expect(client.ends).toBe(1);
  });
});
