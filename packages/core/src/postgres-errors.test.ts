import { describe, expect, it } from 'vitest';
import {
  ConnectionLostError,
  DeadlockError,
  LockkitError,
  LockTableFullError,
  LockTimeoutError,
  NotPrimaryError,
} from './errors.js';
import { fromPostgresError, sqlState } from './postgres-errors.js';

const pgError = (code: string, message = `server error ${code}`) =>
  Object.assign(new Error(message), { code });

describe('fromPostgresError', () => {
  it.each([
    ['55P03', LockTimeoutError, 'LOCK_TIMEOUT'],
    ['40P01', DeadlockError, 'DEADLOCK'],
    ['25P03', ConnectionLostError, 'IDLE_IN_TRANSACTION_TIMEOUT'],
    ['57P01', ConnectionLostError, 'CONNECTION_LOST'],
    ['53200', LockTableFullError, 'LOCK_TABLE_FULL'],
    ['57014', LockkitError, 'STATEMENT_TIMEOUT'],
    ['25006', NotPrimaryError, 'NOT_PRIMARY'],
  ] as const)('maps SQLSTATE %s to its typed error, keeping the cause', (code, type, expected) => {
    const original = pgError(code);
    const mapped = fromPostgresError(original, 'lock x') as LockkitError;
    expect(mapped).toBeInstanceOf(type);
    expect(mapped.code).toBe(expected);
    expect(mapped.cause).toBe(original);
    expect(mapped.message).toContain('lock x');
  });

  it('maps a write refused as read-only (25006) to NotPrimaryError, reason read-only', () => {
    const mapped = fromPostgresError(
      pgError('25006', 'cannot execute INSERT in a read-only transaction'),
      'lease claim',
    );
    expect(mapped).toBeInstanceOf(NotPrimaryError);
    expect((mapped as NotPrimaryError).reason).toBe('read-only');
    expect((mapped as Error).message).toMatch(/primary/);
  });

  it('names the setting to raise when the lock table is full', () => {
    const mapped = fromPostgresError(pgError('53200', 'out of shared memory'), 'lock x') as Error;
    expect(mapped.message).toContain('max_locks_per_transaction');
  });

  it('passes other errors through unchanged', () => {
    const unique = pgError('23505');
    expect(fromPostgresError(unique, 'x')).toBe(unique);
    const plain = new Error('no code');
    expect(fromPostgresError(plain, 'x')).toBe(plain);
    const already = new LockTimeoutError('t');
    expect(fromPostgresError(already, 'x')).toBe(already);
  });

  it('finds the SQLSTATE on a cause chain or on meta, as ORMs wrap it', () => {
    expect(sqlState({ message: 'wrapped', cause: pgError('40P01') })).toBe('40P01');
    expect(sqlState({ meta: { code: '55P03' } })).toBe('55P03');
    expect(sqlState({ code: 'ECONNRESET' })).toBeUndefined();
    expect(sqlState({ code: 'P2028' })).toBeUndefined();
    // Prisma's driver-adapter errors: the SQLSTATE sits two levels down.
    expect(
      sqlState({ code: 'P2010', meta: { driverAdapterError: { cause: { code: '57014' } } } }),
    ).toBe('57014');
  });
});
