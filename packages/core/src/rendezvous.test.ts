/**
 * Rendezvous hashing: the same owner from the same members in any order, an even spread, and a
 * member that joins or leaves moves only the jobs it wins or held.
 */
import { describe, expect, it } from 'vitest';
import { nameHash, type RendezvousMember, rendezvousOwner } from './rendezvous.js';

const member = (name: string): RendezvousMember => ({ name, hash: nameHash(name) });
const jobs = Array.from({ length: 10_000 }, (_, i) => nameHash(`job-${i}`));
const owners = (members: readonly RendezvousMember[]) =>
  jobs.map((j) => rendezvousOwner(members, j)?.name);

describe('rendezvous hashing', () => {
  const eight = Array.from({ length: 8 }, (_, i) => member(`host-${i}:${1000 + i}:abcd`));

  it('picks the same owner whatever the order of the members', () => {
    expect(owners([...eight].reverse())).toEqual(owners(eight));
  });

  it('spreads 10,000 jobs over 8 members within ±15% of an even share', () => {
    const counts = new Map<string, number>();
    for (const o of owners(eight)) counts.set(o as string, (counts.get(o as string) ?? 0) + 1);
    expect(counts.size).toBe(8);
    for (const n of counts.values()) expect(Math.abs(n - 1250)).toBeLessThan(1250 * 0.15);
  });

  it('moves only the jobs of a member that leaves, and only those a joining member wins', () => {
    const before = owners(eight);
    const left = owners(eight.slice(1));
    const moved = before.filter((o, i) => o !== left[i]);
    expect(moved.every((o) => o === eight[0]?.name)).toBe(true);
    const joined = owners([...eight, member('newcomer')]);
    const changed = joined.filter((o, i) => o !== before[i]);
    expect(changed.every((o) => o === 'newcomer')).toBe(true);
    expect(changed.length).toBeGreaterThan(10_000 / 9 / 1.3);
  });

  it('has no owner without members', () => {
    expect(rendezvousOwner([], nameHash('job'))).toBeUndefined();
  });
});
