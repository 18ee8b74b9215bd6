import { describe, expect, it } from 'vitest';
import { BackendWatch } from './backend-watch.js';
import { ConnectionFate } from './connection-fate.js';
import { isConnectionLoss } from './connection-loss.js';

describe('BackendWatch', () => {
  it('aborts the fate of a backend the server no longer has, and only that one', async () => {
    const asked: unknown[][] = [];
    const watch = new BackendWatch(async (_text, params) => {
      asked.push([...params]);
      return [{ pid: 12 }];
    });
    const gone = { pid: 12, fate: new ConnectionFate() };
    const alive = { pid: 13, fate: new ConnectionFate() };
    const stops = [
      watch.add(gone),
      watch.add(alive),
      watch.add({ pid: undefined, fate: new ConnectionFate() }),
    ];
    await watch.check();
    expect(asked).toEqual([[[12, 13]]]);
    expect(gone.fate.aborted).toBe(true);
    expect(isConnectionLoss(gone.fate.reason)).toBe(true);
    expect(alive.fate.aborted).toBe(false);
    for (const stop of stops) stop();
    await watch.check();
    expect(asked).toHaveLength(1);
  });

  it('asks again briefly when nothing is gone yet (a backend exits a moment late)', async () => {
    let calls = 0;
    const watch = new BackendWatch(async () => (++calls < 3 ? [] : [{ pid: 5 }]));
    const lease = { pid: 5, fate: new ConnectionFate() };
    watch.add(lease);
    await watch.check();
    expect(calls).toBe(3);
    expect(lease.fate.aborted).toBe(true);
  });

  it("a failed check aborts every lease with onCheckFailure 'abort', none by default", async () => {
    const down = new Error('server unreachable');
    const strict = new BackendWatch(async () => Promise.reject(down), { onCheckFailure: 'abort' });
    const lenient = new BackendWatch(async () => Promise.reject(down));
    const a = { pid: 1, fate: new ConnectionFate() };
    const b = { pid: 1, fate: new ConnectionFate() };
    strict.add(a);
    lenient.add(b);
    await strict.check();
    await lenient.check();
    expect(a.fate.reason).toBe(down);
    expect(b.fate.aborted).toBe(false);
  });
});

describe('isConnectionLoss', () => {
  it('knows every driver spelling of a lost connection, and nothing else', () => {
    for (const lost of [
      { code: '57P01' },
      { code: '08006' },
      { code: 'ECONNRESET' },
      { code: 'CONNECTION_CLOSED' },
      { code: 'P1017' },
      new Error('Connection terminated unexpectedly'),
      { code: 'P2010', meta: { driverAdapterError: { cause: { code: '57P01' } } } },
      new Error('wrapped', { cause: { code: 'EPIPE' } }),
    ]) {
      expect(isConnectionLoss(lost), JSON.stringify(lost)).toBe(true);
    }
    for (const statementError of [
      { code: '23505' },
      { code: '25P02' },
      { code: '57014' },
      new Error('duplicate key'),
      undefined,
      'text',
    ]) {
      expect(isConnectionLoss(statementError), JSON.stringify(statementError)).toBe(false);
    }
  });
});
