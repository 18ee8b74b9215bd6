import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { LockKey } from '../keys.js';
import {
  checkMilliseconds,
  inlinePrepareStatement,
  inlineTryLockStatement,
  lockStatement,
  unlockStatement,
} from './locks.js';

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
            /^SELECT pg_backend_pid\(\) AS pid, set_config\('statement_timeout', '\d+', true\) AS s0, pg_try_advisory_xact_lock(_shared)?\((\(-?\d+\)::int4, \(-?\d+\)::int4|\(-?\d+\)::int8)\) AS acquired, extract\(epoch FROM transaction_timestamp\(\)\)::text AS began$/,
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
      text: 'SELECT pg_try_advisory_xact_lock($1::int4, $2::int4) AS acquired',
      params: [-5, 7],
    });
    expect(lockStatement(pair, 'session', 'shared', true)).toEqual({
      text: 'SELECT pg_backend_pid() AS pid, true AS acquired FROM pg_advisory_lock_shared($1::int4, $2::int4)',
      params: [-5, 7],
    });
    const int8 = LockKey.fromBigInt(-(2n ** 63n));
    expect(unlockStatement(int8, 'exclusive', 42)).toEqual({
      text: 'SELECT pg_backend_pid() AS pid, CASE WHEN pg_backend_pid() = $2::int4 THEN pg_advisory_unlock($1::int8) END AS released',
      params: ['-9223372036854775808', 42],
    });
  });
});
