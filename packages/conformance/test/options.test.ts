import { isLockkitError } from '@lockkit/core';
import { describe, expect, it } from 'vitest';
import { type ConformanceAdapter, checkConformanceOptions, runConformance } from '../src/index.js';

// Never reached: runConformance must refuse its options before it makes an instance.
const adapter: ConformanceAdapter<unknown, unknown> = {
  name: 'never-used',
  databaseUrl: () => 'postgres://never-used.invalid/none',
  createInstance: () => {
    throw new Error('runConformance made an instance before checking its options');
  },
};

/** The error runConformance throws for these options (plain JavaScript: no types to stop them). */
function refusal(options: unknown): unknown {
  try {
    runConformance(adapter, options as never);
  } catch (error) {
    return error;
  }
  throw new Error('runConformance accepted the options');
}

describe('runConformance refuses options that would skip cases silently', () => {
  it.each([
    [
      "schedulerFaultPoints: 'through-bouncer' (misspelt)",
      { schedulerFaultPoints: 'through-bouncer' },
      /schedulerFaultPoints .*'through-bouncer'/,
    ],
    ['schedulerFaultPoints: 1', { schedulerFaultPoints: 1 }, /schedulerFaultPoints .*got 1/],
    ["groups: ['lease'] (no such group)", { groups: ['lease'] }, /groups: 'lease' is not a group/],
    ['groups: [] (runs nothing)', { groups: [] }, /non-empty array/],
    ["groups: 'faults' (not an array)", { groups: 'faults' }, /non-empty array/],
    ['schedulerSeconds: 5', { schedulerSeconds: 5 }, /schedulerSeconds .*from 8, got 5/],
    ['schedulerSeconds: 12.5', { schedulerSeconds: 12.5 }, /from 8, got 12.5/],
    [
      'schedulerFaultPoint (misspelt name)',
      { schedulerFaultPoint: true },
      /no option "schedulerFaultPoint"/,
    ],
    ['null', null, /must be an object, got null/],
  ])('%s', (_name, options, message) => {
    const error = refusal(options);
    expect(isLockkitError(error)).toBe(true);
    expect((error as { code: string }).code).toBe('OPTION_INVALID');
    expect((error as Error).message).toMatch(message);
  });

  it('accepts every documented form', () => {
    for (const options of [
      undefined,
      {},
      { schedulerFaultPoints: true },
      { schedulerFaultPoints: false },
      { schedulerFaultPoints: 'through-pgbouncer' },
      { groups: ['transaction', 'faults', 'dead-start'], schedulerSeconds: 8 },
    ])
      expect(checkConformanceOptions(options)).toEqual(options ?? {});
  });
});
