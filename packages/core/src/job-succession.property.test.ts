/**
 * Rendezvous ownership over generated member sets and job names: the owner is the first of the
 * succession, independent of the members' order; a member leaving moves only its own jobs, to
 * the next in line; a member joining takes only jobs it now wins; the load is even.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { ownerOf, successionOf } from './job-succession.js';

// The same generated cases on every run (see tick-timer.property.test.ts).
fc.configureGlobal({ seed: Number(process.env.LOCKKIT_PROPERTY_SEED ?? 20261201) });

const memberId = fc.string({ minLength: 1, maxLength: 24 });
const members = fc.uniqueArray(memberId, { minLength: 1, maxLength: 12 });
const jobs = fc.uniqueArray(fc.string({ minLength: 1, maxLength: 40 }), {
  minLength: 1,
  maxLength: 50,
});

describe('job succession (rendezvous hashing)', () => {
  it('the owner is the first of the succession, whatever the order of the members', () => {
    fc.assert(
      fc.property(members, jobs, fc.nat(), (m, js, seed) => {
        const shuffled = [...m].sort((a, b) => ((a.length + seed) % 3) - ((b.length + seed) % 3));
        const reversed = [...m].reverse();
        for (const job of js) {
          const succession = successionOf(job, m);
          expect(succession).toHaveLength(m.length);
          expect(new Set(succession)).toEqual(new Set(m));
          expect(successionOf(job, reversed)).toEqual(succession);
          expect(ownerOf(job, shuffled)).toBe(succession[0]);
        }
      }),
    );
  });

  it('duplicates count once, and no members own nothing', () => {
    expect(successionOf('job', ['a', 'b', 'a'])).toEqual(successionOf('job', ['b', 'a']));
    expect(ownerOf('job', [])).toBeUndefined();
    expect(successionOf('job', [])).toEqual([]);
  });

  it('a member leaving moves only its own jobs, each to the next in its succession', () => {
    fc.assert(
      fc.property(members, jobs, fc.nat(), (m, js, pick) => {
        const gone = m[pick % m.length] as string;
        const left = m.filter((x) => x !== gone);
        for (const job of js) {
          const before = successionOf(job, m);
          const after = successionOf(job, left);
          // The order of those who stay does not change: the next in line takes over.
          expect(after).toEqual(before.filter((x) => x !== gone));
          if (before[0] !== gone) expect(ownerOf(job, left)).toBe(before[0]);
        }
      }),
    );
  });

  it('a member joining takes only the jobs it now wins', () => {
    fc.assert(
      fc.property(members, memberId, jobs, (m, joining, js) => {
        fc.pre(!m.includes(joining));
        for (const job of js) {
          const owner = ownerOf(job, [...m, joining]);
          expect([ownerOf(job, m), joining]).toContain(owner);
        }
      }),
    );
  });

  it('1,000 jobs over 8 members: each owns between 0.75 and 1.25 of an even share', () => {
    const ids = Array.from({ length: 8 }, (_, i) => `instance-${i}`);
    const owned = new Map(ids.map((id) => [id, 0]));
    for (let j = 0; j < 1000; j++) {
      const owner = ownerOf(`job-${j}`, ids) as string;
      owned.set(owner, (owned.get(owner) ?? 0) + 1);
    }
    for (const count of owned.values()) {
      expect(count).toBeGreaterThanOrEqual(0.75 * 125);
      expect(count).toBeLessThanOrEqual(1.25 * 125);
    }
  });
});
