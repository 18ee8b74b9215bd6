import { describe, expect, it } from 'vitest';
import { inTransactionBlock, inTransactionFrom } from './ready-status.js';

describe('ReadyForQuery status', () => {
  it("is a transaction block in 'T' and 'E', not in 'I' nor when unknown", () => {
    expect(['I', 'T', 'E', null, undefined].map(inTransactionBlock)).toEqual([
      false,
      true,
      true,
      false,
      false,
    ]);
  });

  it('gives a session context inTransaction only when the driver keeps the status', () => {
    let status = 'I';
    const probe = inTransactionFrom({ getTransactionStatus: () => status });
    expect(probe.inTransaction?.()).toBe(false);
    status = 'E';
    expect(probe.inTransaction?.()).toBe(true);
    expect(inTransactionFrom({})).toEqual({});
    expect(inTransactionFrom(undefined)).toEqual({});
  });
});
