import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { LockKey } from '../keys.js';
import {
  checkMilliseconds,
  guardedSessionLockStatement,
  IN_RECOVERY,
  inlinePrepareStatement,
  inlineTryLockStatement,
  lockStatement,
  oneTripTryLockStatement,
  SKIP_MARKER,
  STANDBY_MARKER,
  unlockStatement,
} from './locks.js';
import { tickJudgeStatement } from './scheduler.js';

const anyKey = fc.oneof(
  fc.tuple(fc.integer(), fc.integer()).map(([a, b]) => LockKey.fromPair(a, b)),
  fc.bigInt({ min: -(2n ** 63n), max: 2n ** 63n - 1n }).map((n) => LockKey.fromBigInt(n)),
);

describe('inlined statements', () => {
  it('contain nothing but validated integers', () => {
    fc.assert(
      fc.property(
        anyKey,
        fc.constantFrom('exclusive', 'shared') as fc.Arbitrary<'exclusive' | 'shared'>,
        fc.nat({ max: 2_147_483_647 }),
        (key, mode, ms) => {
          const text = inlineTryLockStatement(key, mode, [['statement_timeout', ms]]);
          expect(text).toMatch(
            /^SELECT pg_backend_pid\(\) AS pid, set_config\('statement_timeout', '\d+', true\) AS s0, CASE WHEN pg_catalog\.pg_is_in_recovery\(\) THEN NULL ELSE pg_try_advisory_xact_lock(_shared)?\((\(-?\d+\)::int4, \(-?\d+\)::int4|\(-?\d+\)::int8)\) END AS acquired, extract\(epoch FROM transaction_timestamp\(\)\)::text AS began, pg_catalog\.pg_is_in_recovery\(\) AS in_recovery$/,
          );
        },
      ),
    );
    expect(inlinePrepareStatement([['lock_timeout', 5000]])).toBe(
      "SELECT pg_backend_pid() AS pid, set_config('lock_timeout', '5000', true) AS s0, extract(epoch FROM transaction_timestamp())::text AS began",
    );
  });

  it('refuse a setting value that is not a valid millisecond integer', () => {
    for (const bad of [-1, 1.5, Number.NaN, 2 ** 31, '5; DROP TABLE x' as unknown as number]) {
      expect(() =>
        inlineTryLockStatement(LockKey.fromPair(1, 2), 'exclusive', [['lock_timeout', bad]]),
      ).toThrow(expect.objectContaining({ code: 'OPTION_INVALID' }));
    }
    expect(checkMilliseconds(0, 'x', 0)).toBe(0);
    expect(() => checkMilliseconds(0, 'x', 1)).toThrow(/from 1/);
  });
});

describe('parameterised statements', () => {
  it('pick the function for scope, mode and waiting, with typed parameters', () => {
    const pair = LockKey.fromPair(-5, 7);
    expect(lockStatement(pair, 'transaction', 'exclusive', false)).toEqual({
      text: 'SELECT CASE WHEN pg_catalog.pg_is_in_recovery() THEN NULL ELSE pg_try_advisory_xact_lock($1::int4, $2::int4) END AS acquired, pg_catalog.pg_is_in_recovery() AS in_recovery',
      params: [-5, 7],
    });
    expect(lockStatement(pair, 'session', 'shared', true)).toEqual({
      text: 'SELECT pg_backend_pid() AS pid, CASE WHEN pg_catalog.pg_is_in_recovery() THEN NULL ELSE (SELECT true FROM pg_advisory_lock_shared($1::int4, $2::int4)) END AS acquired, pg_catalog.pg_is_in_recovery() AS in_recovery',
      params: [-5, 7],
    });
    const int8 = LockKey.fromBigInt(-(2n ** 63n));
    expect(unlockStatement(int8, 'exclusive', 42)).toEqual({
      text: 'SELECT pg_backend_pid() AS pid, CASE WHEN pg_backend_pid() = $2::int4 THEN pg_advisory_unlock($1::int8) END AS released',
      params: ['-9223372036854775808', 42],
    });
  });
});

describe('a lock proves itself where it is taken', () => {
  const key = LockKey.fromPair(3, 4);
  const modes = ['exclusive', 'shared'] as const;
  /** The lock function's call comes only after the recovery check, in the same statement. */
  const checkedFirst = (text: string) => {
    const check = text.indexOf('pg_catalog.pg_is_in_recovery()');
    const lock = text.search(/pg_(try_)?advisory_(xact_)?lock/);
    expect(check).toBeGreaterThan(-1);
    expect(lock).toBeGreaterThan(check);
  };

  it('every statement that takes an advisory lock reports in_recovery and takes nothing on a standby', () => {
    for (const mode of modes) {
      for (const scope of ['transaction', 'session'] as const) {
        for (const wait of [false, true]) {
          const { text } = lockStatement(key, scope, mode, wait);
          expect(text).toContain(`, ${IN_RECOVERY}`);
          checkedFirst(text);
        }
      }
      for (const wait of [false, true]) {
        const { text } = guardedSessionLockStatement(key, mode, wait, 42);
        expect(text).toContain(`AND NOT pg_catalog.pg_is_in_recovery() THEN`);
        expect(text).toContain(`, ${IN_RECOVERY}`);
        // The pid prefix stays first: executors learn their backend from it.
        expect(text.startsWith('SELECT pg_backend_pid() AS pid, ')).toBe(true);
      }
      const inline = inlineTryLockStatement(key, mode, []);
      expect(inline.startsWith('SELECT pg_backend_pid() AS pid, ')).toBe(true);
      expect(inline).toContain(IN_RECOVERY);
      checkedFirst(inline);
    }
    const holders = tickJudgeStatement(key, LockKey.fromPair(5, 6)).text;
    expect(holders).toContain(IN_RECOVERY);
    checkedFirst(holders);
  });

  it('the one-round-trip try-lock raises its own marker on a standby, before trying the lock', () => {
    for (const mode of modes) {
      const text = oneTripTryLockStatement(key, mode, []);
      expect(text).toContain(
        `CASE WHEN pg_catalog.pg_is_in_recovery() THEN '${STANDBY_MARKER}' WHEN pg_try_advisory_xact_lock`,
      );
      expect(text).toContain(`ELSE '${SKIP_MARKER}' END)::boolean AS acquired`);
      checkedFirst(text);
    }
    // A skip and a standby are told apart by their markers.
    expect(STANDBY_MARKER.includes(SKIP_MARKER) || SKIP_MARKER.includes(STANDBY_MARKER)).toBe(
      false,
    );
  });
});
