/**
 * Rendezvous (highest random weight) hashing: the owner of a job is the member with the highest
 * weight for it. Every instance that sees the same members picks the same owner, and a member
 * that joins or leaves moves only the jobs it wins or held (about 1/n of them).
 *
 * The hashes are 32-bit FNV-1a of the UTF-16 code units, mixed by murmur3's finaliser: cheap,
 * identical in every process, and not security-sensitive (a name chooses only who decides).
 *
 * @packageDocumentation
 */

/** 32-bit FNV-1a over the string's UTF-16 code units. */
export function nameHash(text: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) {
    h ^= text.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  return h >>> 0;
}

/** The weight of `member` for `job`, from their {@link nameHash}es (murmur3's fmix32). */
export function rendezvousWeight(memberHash: number, jobHash: number): number {
  let h = (memberHash ^ Math.imul(jobHash, 0x9e3779b1)) >>> 0;
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}

/** A member as rendezvous hashing sees it: its name and the {@link nameHash} of it. */
export interface RendezvousMember {
  readonly name: string;
  readonly hash: number;
}

/**
 * The member with the highest weight for the job (ties, which need equal 32-bit weights, go to
 * the smaller name), or undefined when there is none.
 */
export function rendezvousOwner(
  members: readonly RendezvousMember[],
  jobHash: number,
): RendezvousMember | undefined {
  let best: RendezvousMember | undefined;
  let bestWeight = -1;
  for (const m of members) {
    const w = rendezvousWeight(m.hash, jobHash);
    if (w > bestWeight || (w === bestWeight && best !== undefined && m.name < best.name)) {
      best = m;
      bestWeight = w;
    }
  }
  return best;
}
