import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import vectors from '../test/fixtures/lock-keys.json' with { type: 'json' };
import { isLockkitError, LockKeyError } from './errors.js';
import { generateLockKeys, LockKey, MAX_KEY_NAME_BYTES } from './keys.js';

const INT32_MIN = -(2 ** 31);
const INT32_MAX = 2 ** 31 - 1;

function keyErrorCode(fn: () => unknown): string {
  try {
    fn();
  } catch (error) {
    expect(error).toBeInstanceOf(LockKeyError);
    expect(isLockkitError(error)).toBe(true);
    return (error as LockKeyError).code;
  }
  throw new Error('expected a LockKeyError, nothing was thrown');
}

describe('generateLockKeys: the compatibility vectors', () => {
  it.each(vectors.cases.map((c) => [c.namespace.slice(0, 24), c.jobKey, c] as const))(
    '%s / %s',
    (_ns, _job, c) => {
      expect(generateLockKeys(c.namespace, c.jobKey)).toEqual([c.key1, c.key2]);
      const key = LockKey.fromNames(c.namespace, c.jobKey);
      expect(key.pgLocks).toEqual(c.pg_locks);
      expect(LockKey.fromPgLocks({ locktype: 'advisory', ...c.pg_locks }).equals(key)).toBe(true);
    },
  );

  it('covers every case of the fixture', () => {
    expect(vectors.scheme).toBe('seed-sha256-int32x2');
    expect(vectors.cases.length).toBeGreaterThanOrEqual(8);
  });
});

describe('generateLockKeys: properties', () => {
  it('is deterministic and always yields int32 values', () => {
    fc.assert(
      fc.property(
        fc.string({ minLength: 1, maxLength: 200, unit: 'grapheme' }),
        fc.string({ minLength: 1, maxLength: 200, unit: 'grapheme' }),
        (ns, job) => {
          const [a, b] = generateLockKeys(ns, job);
          expect(generateLockKeys(ns, job)).toEqual([a, b]);
          for (const k of [a, b]) {
            expect(Number.isInteger(k) && k >= INT32_MIN && k <= INT32_MAX).toBe(true);
          }
          // key1 depends on the namespace only.
          expect(generateLockKeys(ns, `${job}x`)[0]).toBe(a);
        },
      ),
    );
  });

  it('rejects every non-string input with KEY_NOT_STRING', () => {
    fc.assert(
      fc.property(
        fc.anything().filter((v) => typeof v !== 'string'),
        (bad) => {
          expect(keyErrorCode(() => generateLockKeys(bad as string, 'job'))).toBe('KEY_NOT_STRING');
          expect(keyErrorCode(() => generateLockKeys('ns', bad as string))).toBe('KEY_NOT_STRING');
        },
      ),
    );
  });

  it('rejects empty, malformed and over-long names', () => {
    expect(keyErrorCode(() => generateLockKeys('', 'job'))).toBe('KEY_EMPTY');
    expect(keyErrorCode(() => generateLockKeys('ns', ''))).toBe('KEY_EMPTY');
    expect(keyErrorCode(() => generateLockKeys('ns', 'a\uD800b'))).toBe('KEY_MALFORMED');
    const limit = 'x'.repeat(MAX_KEY_NAME_BYTES);
    expect(() => generateLockKeys(limit, limit)).not.toThrow();
    expect(keyErrorCode(() => generateLockKeys(`${limit}x`, 'job'))).toBe('KEY_TOO_LONG');
    // The limit counts UTF-8 bytes, not UTF-16 units: 342 × 3 bytes > 1024.
    expect(keyErrorCode(() => generateLockKeys('ns', '€'.repeat(342)))).toBe('KEY_TOO_LONG');
  });
});

describe('LockKey.fromPair', () => {
  it('round-trips any int32 pair through pg_locks coordinates', () => {
    fc.assert(
      fc.property(fc.integer(), fc.integer(), (a, b) => {
        const key = LockKey.fromPair(a, b);
        const coords = key.pgLocks;
        expect(coords.objsubid).toBe(2);
        expect(coords.classid).toBeGreaterThanOrEqual(0);
        expect(coords.classid).toBeLessThanOrEqual(2 ** 32 - 1);
        const back = LockKey.fromPgLocks(coords);
        expect(back.kind).toBe('pair');
        expect(back.pair).toEqual([a, b]);
        // Drivers may hand oids back as strings.
        const asStrings = LockKey.fromPgLocks({
          classid: String(coords.classid),
          objid: String(coords.objid),
          objsubid: '2',
        });
        expect(asStrings.equals(key)).toBe(true);
      }),
    );
  });

  it('rejects anything that is not an int32', () => {
    fc.assert(
      fc.property(
        fc.oneof(
          fc.double().filter((d) => !Number.isInteger(d)),
          fc.integer({ min: INT32_MAX + 1, max: Number.MAX_SAFE_INTEGER }),
          fc.integer({ min: Number.MIN_SAFE_INTEGER, max: INT32_MIN - 1 }),
          fc.constantFrom(Number.NaN, Number.POSITIVE_INFINITY, Number.NEGATIVE_INFINITY),
        ),
        (bad) => {
          expect(['KEY_NOT_INTEGER', 'KEY_OUT_OF_RANGE']).toContain(
            keyErrorCode(() => LockKey.fromPair(bad, 0)),
          );
          expect(['KEY_NOT_INTEGER', 'KEY_OUT_OF_RANGE']).toContain(
            keyErrorCode(() => LockKey.fromPair(0, bad)),
          );
        },
      ),
    );
    expect(keyErrorCode(() => LockKey.fromPair(1.5, 0))).toBe('KEY_NOT_INTEGER');
    expect(keyErrorCode(() => LockKey.fromPair(Number.NaN, 0))).toBe('KEY_NOT_INTEGER');
    expect(keyErrorCode(() => LockKey.fromPair(2 ** 31, 0))).toBe('KEY_OUT_OF_RANGE');
    expect(keyErrorCode(() => LockKey.fromPair(0, '1' as unknown as number))).toBe(
      'KEY_NOT_INTEGER',
    );
    expect(keyErrorCode(() => LockKey.fromPair(1n as unknown as number, 0))).toBe(
      'KEY_NOT_INTEGER',
    );
  });

  it('normalises -0', () => {
    expect(Object.is(LockKey.fromPair(-0, 1).pair?.[0], 0)).toBe(true);
  });
});

describe('LockKey.fromBigInt', () => {
  it('round-trips any int64 through pg_locks coordinates, apart from every pair', () => {
    fc.assert(
      fc.property(fc.bigInt({ min: -(2n ** 63n), max: 2n ** 63n - 1n }), (n) => {
        const key = LockKey.fromBigInt(n);
        const coords = key.pgLocks;
        expect(coords.objsubid).toBe(1);
        const back = LockKey.fromPgLocks({ locktype: 'advisory', ...coords });
        expect(back.kind).toBe('int8');
        expect(back.int8).toBe(n);
        expect(back.equals(key)).toBe(true);
        expect(back.equals(LockKey.fromPair(coords.classid | 0, coords.objid | 0))).toBe(false);
      }),
    );
  });

  it('rejects out-of-range and non-bigint values', () => {
    expect(keyErrorCode(() => LockKey.fromBigInt(2n ** 63n))).toBe('KEY_OUT_OF_RANGE');
    expect(keyErrorCode(() => LockKey.fromBigInt(-(2n ** 63n) - 1n))).toBe('KEY_OUT_OF_RANGE');
    expect(keyErrorCode(() => LockKey.fromBigInt(42 as unknown as bigint))).toBe('KEY_NOT_INTEGER');
  });
});

describe('LockKey.fromPgLocks', () => {
  it('rejects rows that are not advisory locks or hold impossible values', () => {
    expect(
      keyErrorCode(() =>
        LockKey.fromPgLocks({ locktype: 'relation', classid: 1, objid: 2, objsubid: 2 }),
      ),
    ).toBe('KEY_NOT_ADVISORY');
    expect(keyErrorCode(() => LockKey.fromPgLocks({ classid: 1, objid: 2, objsubid: 0 }))).toBe(
      'KEY_NOT_ADVISORY',
    );
    expect(keyErrorCode(() => LockKey.fromPgLocks({ classid: -1, objid: 2, objsubid: 2 }))).toBe(
      'KEY_OUT_OF_RANGE',
    );
    expect(
      keyErrorCode(() => LockKey.fromPgLocks({ classid: 2 ** 32, objid: 2, objsubid: 2 })),
    ).toBe('KEY_OUT_OF_RANGE');
    expect(keyErrorCode(() => LockKey.fromPgLocks({ classid: null, objid: 2, objsubid: 2 }))).toBe(
      'KEY_NOT_INTEGER',
    );
    expect(keyErrorCode(() => LockKey.fromPgLocks({ classid: '1e3', objid: 2, objsubid: 2 }))).toBe(
      'KEY_NOT_INTEGER',
    );
  });

  it('prints keys readably and keeps the names of named keys', () => {
    const named = LockKey.fromNames('cron_jobs', 'generate_invoices');
    expect(String(named)).toBe('cron_jobs/generate_invoices (-266172150,1646866057)');
    expect(named.names).toEqual({ namespace: 'cron_jobs', jobKey: 'generate_invoices' });
    expect(String(LockKey.fromBigInt(-5n))).toBe('int8 -5');
    expect(Object.isFrozen(named)).toBe(true);
  });
});
