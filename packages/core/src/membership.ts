/**
 * Who decides a job's ticks with `decide: 'owner'`: the live scheduler instances of one namespace,
 * as the `members` table says at this instance's last heartbeat, and for each job the one that
 * rendezvous hashing picks among them ({@link rendezvousOwner}).
 *
 * The view is a hint, never a guard: two instances that both think they own a job both run the
 * tick protocol (its locks and ledger row dedup them), and a job nobody thinks it owns is the
 * gap that {@link MembershipChange.gone} lets the next owner take over.
 *
 * @packageDocumentation
 */
import type { QueryFn } from './executor.js';
import { nameHash, type RendezvousMember, rendezvousOwner } from './rendezvous.js';
import { heartbeatMembersStatement, leaveMembersStatement } from './sql/members.js';

/** How a membership is kept: its heartbeat and when a silent member counts as gone. */
export interface MembershipTiming {
  /** How often this instance heartbeats (and re-reads the members), in ms. */
  readonly heartbeatMs: number;
  /** A member whose last heartbeat is older than this (on the reader's clock) is gone. */
  readonly expireMs: number;
}

/** What a heartbeat changed: the members before it, and those gone since, with their last beat. */
export interface MembershipChange {
  readonly before: readonly RendezvousMember[];
  /** Members of the view before that are not live any more, by name: their last heartbeat seen (ms). */
  readonly gone: ReadonlyMap<string, number>;
}

/** Rows dead this many `expireMs` are deleted by the next heartbeat of any instance. */
const FORGET_AFTER_EXPIRIES = 100;

/** One instance's membership in its namespace, and its view of the others. */
export class Membership {
  private members: readonly RendezvousMember[];
  private beats: ReadonlyMap<string, number> = new Map<string, number>();
  private readonly self: RendezvousMember;

  constructor(
    private readonly scope: { readonly schema: string; readonly namespace: string },
    owner: string,
    readonly timing: MembershipTiming,
  ) {
    this.self = { name: owner, hash: nameHash(owner) };
    // Before the first heartbeat an instance knows only itself: it decides every job (safe).
    this.members = [this.self];
  }

  /** Whether this instance decides the job whose {@link nameHash} is `jobHash`. */
  decides(jobHash: number): boolean {
    return rendezvousOwner(this.members, jobHash) === this.self;
  }

  /** The name of the member that decides the job of `jobHash` in `members` (default: the current view). */
  ownerOf(jobHash: number, members: readonly RendezvousMember[] = this.members): string {
    return (rendezvousOwner(members, jobHash) ?? this.self).name;
  }

  /** The live members' names, this instance's included, sorted. */
  names(): string[] {
    return this.members.map((m) => m.name).sort();
  }

  /**
   * Heartbeats at `now` (this instance's clock) and reads the live members, in one statement:
   * resolves with each live member's last heartbeat (ms), this instance's included. The view is
   * left as it was: {@link Membership.see} replaces it once the heartbeat's transaction committed,
   * so a heartbeat that fails at COMMIT does not make a gone member's going pass unseen.
   */
  async heartbeat(query: QueryFn, now: Date): Promise<ReadonlyMap<string, number>> {
    const { expireMs } = this.timing;
    const s = heartbeatMembersStatement(
      this.scope.schema,
      this.scope.namespace,
      this.self.name,
      now,
      expireMs,
      expireMs * FORGET_AFTER_EXPIRIES,
    );
    const rows = await query(s.text, s.params);
    const beats = new Map<string, number>();
    for (const r of rows) beats.set(String(r.owner), new Date(String(r.heartbeat_at)).getTime());
    beats.set(this.self.name, now.getTime());
    return beats;
  }

  /** Replaces the view with the live members of a committed {@link Membership.heartbeat}. */
  see(beats: ReadonlyMap<string, number>): MembershipChange {
    const before = this.members;
    const gone = new Map<string, number>();
    for (const m of before) {
      const last = this.beats.get(m.name);
      if (!beats.has(m.name) && last !== undefined) gone.set(m.name, last);
    }
    const known = new Map(before.map((m) => [m.name, m]));
    this.members = [...beats.keys()].map(
      (name) => known.get(name) ?? { name, hash: nameHash(name) },
    );
    this.beats = beats;
    return { before, gone };
  }

  /** Leaves the namespace (a clean stop): the next heartbeat of every other member sees it gone. */
  async leave(query: QueryFn): Promise<void> {
    const s = leaveMembersStatement(this.scope.schema, this.scope.namespace, this.self.name);
    await query(s.text, s.params);
  }
}
