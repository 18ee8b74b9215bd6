/** The chaos verdict's rule: each broken invariant alone makes the run fail. */
import { describe, expect, it } from 'vitest';
import { type ChaosTallies, invariantsHeld } from '../src/chaos-verdict.js';

const KINDS = ['kill', 'partition'];
const clean: ChaosTallies = {
  duplicates: 0,
  missed: 0,
  failed: 0,
  staleWritesAccepted: 0,
  tokenViolations: 0,
  exclusivityViolations: 0,
  leakedLocks: 0,
  leakedConnections: 0,
  workerCrashes: [],
  faults: { kill: 3, partition: 1 },
};

describe('chaos verdict', () => {
  it('holds for a clean run that applied every fault kind', () => {
    expect(invariantsHeld(clean, KINDS)).toBe(true);
  });

  it.each([
    ['a duplicate', { duplicates: 1 }],
    ['a missed tick', { missed: 1 }],
    ['a failed run', { failed: 1 }],
    ['a stale write accepted', { staleWritesAccepted: 1 }],
    ['a token out of order', { tokenViolations: 1 }],
    ['two holders seen', { exclusivityViolations: 1 }],
    ['a leaked lock', { leakedLocks: 1 }],
    ['a leaked connection', { leakedConnections: 1 }],
    ['a worker that crashed of its own error', { workerCrashes: [{ worker: 'w1', error: 'x' }] }],
    ['a fault kind never applied', { faults: { kill: 3 } }],
  ])('fails with %s', (_, broken) => {
    expect(invariantsHeld({ ...clean, ...broken }, KINDS)).toBe(false);
  });
});
