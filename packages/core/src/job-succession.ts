/**
 * Which live scheduler instance decides a job: rendezvous (highest-random-weight) hashing over
 * the members of a namespace.
 *
 * Every instance computes the same order from the same member list, with no coordination: each
 * member scores each job with a hash of the pair, and the members ranked by score are the job's
 * succession. The first decides the job's ticks; when it goes, the next in line takes over. A
 * member that joins or leaves moves only the jobs it wins or held (about 1/n of them), never
 * reshuffles the rest.
 *
 * @packageDocumentation
 */
import * as nodeCrypto from 'node:crypto';

/** A member's score for a job: 48 bits of SHA-256 over the pair, length-prefixed so no two pairs
 * share a text. */
function score(member: string, job: string): number {
  return nodeCrypto
    .createHash('sha256')
    .update(`${member.length}:${member}${job}`, 'utf8')
    .digest()
    .readUIntBE(0, 6);
}

/**
 * The members in the order they take `job`: the first owns it, the second takes over when the
 * first is gone, and so on. The same set in any order gives the same succession; duplicates count
 * once. Ties between scores (1 in 2^48) go to the member whose id sorts first.
 */
export function successionOf(job: string, members: Iterable<string>): string[] {
  const scored = [...new Set(members)].map((member) => ({ member, score: score(member, job) }));
  scored.sort((a, b) =>
    a.score !== b.score
      ? b.score - a.score
      : a.member < b.member
        ? -1
        : a.member > b.member
          ? 1
          : 0,
  );
  return scored.map((s) => s.member);
}

/** The member that decides `job` among `members`: the first of its succession; none when empty. */
export function ownerOf(job: string, members: Iterable<string>): string | undefined {
  let best: string | undefined;
  let bestScore = -1;
  for (const member of new Set(members)) {
    const s = score(member, job);
    if (s > bestScore || (s === bestScore && best !== undefined && member < best)) {
      best = member;
      bestScore = s;
    }
  }
  return best;
}
