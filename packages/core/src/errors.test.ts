import { createRequire } from 'node:module';
import { describe, expect, it } from 'vitest';
import {
  isLockkitError,
  LockKeyError,
  LockkitError,
  UnsupportedCapabilityError,
} from './errors.js';

describe('LockkitError', () => {
  it('carries code, name, cause and a real stack', () => {
    const cause = new Error('driver said no');
    const error = new LockkitError('EXECUTOR_INVALID', 'bad executor', { cause });
    expect(error.code).toBe('EXECUTOR_INVALID');
    expect(error.name).toBe('LockkitError');
    expect(error.cause).toBe(cause);
    expect(error.stack).toContain('errors.test.ts');
    expect(error).toBeInstanceOf(Error);
  });

  it('omits cause when none is given', () => {
    expect('cause' in new LockkitError('EXECUTOR_INVALID', 'x')).toBe(false);
  });

  it('subclasses keep their own name and stay LockkitErrors', () => {
    const key = new LockKeyError('KEY_EMPTY', 'empty');
    expect(key.name).toBe('LockKeyError');
    expect(key).toBeInstanceOf(LockkitError);
    const capability = new UnsupportedCapabilityError('prisma', 'sessions', 'Use a lease.');
    expect(capability.message).toBe('The prisma adapter does not support sessions. Use a lease.');
    expect(capability.adapter).toBe('prisma');
    expect(capability.code).toBe('CAPABILITY_UNSUPPORTED');
  });
});

describe('isLockkitError', () => {
  it('rejects look-alikes', () => {
    for (const value of [
      null,
      undefined,
      1,
      'LockkitError',
      new Error('x'),
      { code: 'KEY_EMPTY' },
    ]) {
      expect(isLockkitError(value)).toBe(false);
    }
  });

  // The CJS build (turbo builds it before tests) is a distinct copy of every class: exactly the
  // situation of two copies of @lockkit/core in one node_modules.
  const cjsBuild = new URL('../dist/index.cjs', import.meta.url);
  it('recognises errors from another copy of the package', () => {
    const other = createRequire(import.meta.url)(cjsBuild.pathname) as typeof import('./index.js');
    const foreign = new other.LockKeyError('KEY_EMPTY', 'from the other copy');
    expect(foreign).not.toBeInstanceOf(LockKeyError);
    expect(isLockkitError(foreign)).toBe(true);
    expect(other.isLockkitError(new LockKeyError('KEY_EMPTY', 'from this copy'))).toBe(true);
  });
});
