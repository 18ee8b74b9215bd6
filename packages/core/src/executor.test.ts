import { describe, expect, it } from 'vitest';
import { isLockkitError, UnsupportedCapabilityError } from './errors.js';
import {
  assertLockExecutor,
  hasCapability,
  type LockExecutor,
  requireCapability,
} from './executor.js';

// Capability checks happen before any SQL, so an executor that can never reach a database proves
// that nothing was sent: every method throws if called.
const unreachable = (): never => {
  throw new Error('no SQL may be sent');
};
const transactionOnly: LockExecutor = { name: 'tx-only', transaction: unreachable };
const full: LockExecutor = {
  name: 'full',
  transaction: unreachable,
  session: unreachable,
  pipelinedTransaction: unreachable,
};

describe('capabilities', () => {
  it('exist exactly when their method exists', () => {
    expect(hasCapability(transactionOnly, 'session')).toBe(false);
    expect(hasCapability(transactionOnly, 'pipelinedTransaction')).toBe(false);
    expect(hasCapability(full, 'session')).toBe(true);
    expect(hasCapability(full, 'pipelinedTransaction')).toBe(true);
  });

  it('fail early with a typed error that names the adapter', () => {
    let thrown: unknown;
    try {
      requireCapability(transactionOnly, 'session', 'Use a lease for long jobs.');
    } catch (error) {
      thrown = error;
    }
    expect(thrown).toBeInstanceOf(UnsupportedCapabilityError);
    expect(isLockkitError(thrown)).toBe(true);
    const error = thrown as UnsupportedCapabilityError;
    expect(error.code).toBe('CAPABILITY_UNSUPPORTED');
    expect(error.adapter).toBe('tx-only');
    expect(error.message).toMatch(/^The tx-only adapter does not support session-scoped/);
    expect(error.message).toContain('Use a lease for long jobs.');
    expect(() => requireCapability(full, 'session')).not.toThrow();
  });
});

describe('assertLockExecutor', () => {
  it('accepts a minimal executor', () => {
    expect(() => assertLockExecutor(transactionOnly)).not.toThrow();
  });

  it.each([
    ['null', null],
    ['a string', 'pg'],
    ['no name', { transaction: unreachable }],
    ['no transaction', { name: 'x' }],
    ['a non-function session', { name: 'x', transaction: unreachable, session: true }],
  ])('rejects %s with EXECUTOR_INVALID', (_label, value) => {
    expect(() => assertLockExecutor(value)).toThrow(
      expect.objectContaining({ code: 'EXECUTOR_INVALID' }),
    );
  });
});
