/**
 * A scheduler instance's membership of its namespace, for owned distribution: its heartbeat (one
 * statement a beat, which also reads the other members), and the {@link MembershipView} that the
 * heartbeat keeps, from which the scheduler learns which jobs it decides and which ticks it owes.
 *
 * Timings: a row lives `ttlMs` after each beat; an instance whose beats failed for `staleMs`
 * (less than `ttlMs`: it stops trusting its view before its own row can expire and a successor
 * take its jobs) decides every job until a beat succeeds again. A member that is killed is seen
 * gone by the others at most `ttlMs` + one beat after its last beat; they then owe its jobs'
 * ticks from that last beat on. A member that stops leaves at once, its departure dated at its
 * stop however late the leave is written.
 *
 * @packageDocumentation
 */
import { randomUUID } from 'node:crypto';
import type { Row } from './executor.js';
import { MembershipView } from './membership-view.js';
import type { Statement } from './sql/locks.js';
import type { LedgerScope } from './sql/scheduler.js';
import {
  memberHeartbeatStatement,
  memberLeaveStatement,
  pruneMembersStatement,
} from './sql/scheduler-members.js';

/** The timings of a membership (ms). */
export interface MembershipSettings {
  /** How often the instance beats. */
  readonly heartbeatMs: number;
  /** How long a beat keeps the instance's row live. Above two beats. */
  readonly ttlMs: number;
  /** After how long without a beat the instance decides every job. Below `ttlMs`. */
  readonly staleMs: number;
}

/** The default timings: a beat a second, live for three, stale after two and a half. */
export const DEFAULT_MEMBERSHIP: MembershipSettings = {
  heartbeatMs: 1000,
  ttlMs: 3000,
  staleMs: 2500,
};

/** How far back a beat reads departures when its previous read is recent: three TTLs. */
const DEPARTURE_WINDOWS = 3;

/** Rows that stopped being live this many TTLs ago are removed (by any member, now and then). */
const PRUNE_AFTER_TTLS = 20;

/** How a member runs one statement in a transaction of its own. */
export type RunStatement = (statement: Statement) => Promise<Row[]>;

/** One instance's heartbeat and view of its namespace's members. */
export class SchedulerMembership {
  /** Who decides each job, as of the last successful beat. */
  readonly view: MembershipView;
  /** The database's instant of the previous successful read (epoch ms), for the departure window. */
  private previousReadMs: number | null = null;
  /** When that read's answer came (this clock): with it, a local instant is dated on the database's. */
  private previousAnswerAt = 0;
  private beats = 0;
  private left = false;
  /**
   * The heartbeat statements sent and not yet answered: a leave waits for them, as one answered
   * after the leave's would make the row live again (or insert it, for a first beat) for a TTL.
   */
  private readonly writing = new Set<Promise<unknown>>();
  /** The live members the view was last given, as processes (member id and incarnation). */
  private live: ReadonlySet<string> = new Set();
  /** Set when the registrations must be read again at the next beat, members changed or not. */
  private reread = false;
  /** This process's incarnation of its member id: new at each start of a process. */
  private readonly incarnation = randomUUID();

  /**
   * @param run - runs one statement in its own transaction
   * @param scope - the scheduler's schema and namespace
   * @param self - this instance's member id (the scheduler's owner id: unique per process)
   * @param settings - the timings
   * @param now - this instance's clock (ms), the one the scheduler fires ticks by
   * @param registeredOf - the members that registered a job (undefined: all did)
   * @param membersChanged - awaited when a beat finds the live members changed, before the view
   *   takes them (to read who registered what among them)
   */
  constructor(
    private readonly run: RunStatement,
    private readonly scope: LedgerScope,
    private readonly self: string,
    readonly settings: MembershipSettings,
    private readonly now: () => number,
    registeredOf?: (job: string) => ReadonlySet<string> | undefined,
    private readonly membersChanged?: (live: ReadonlySet<string>) => Promise<void>,
  ) {
    if (!(settings.staleMs < settings.ttlMs && settings.heartbeatMs * 2 < settings.ttlMs)) {
      throw new RangeError(
        'membership timings: staleMs must be below ttlMs, and ttlMs above two heartbeats',
      );
    }
    this.view = new MembershipView(self, { staleMs: settings.staleMs }, registeredOf);
  }

  /**
   * One beat: renews this instance's row and reads the others'. When the live members changed,
   * `membersChanged` (the constructor's) is awaited before the view takes them: what the view
   * asks of the caller (who registered which job) is then current. The view is updated last, with
   * nothing awaited after it: the caller reads it (jobs now owed) before any timer can fire.
   * Rejects when a statement fails (the view then grows stale on its own). After
   * {@link SchedulerMembership.leave}, does nothing: a beat in flight must not bring a stopped
   * member back.
   */
  async beat(): Promise<void> {
    if (this.left) return;
    const at = this.now();
    const statement = memberHeartbeatStatement(
      this.scope,
      this.self,
      this.incarnation,
      this.settings.ttlMs,
      this.previousReadMs,
      DEPARTURE_WINDOWS * this.settings.ttlMs,
    );
    const write = this.run(statement);
    this.writing.add(write);
    let rows: Awaited<typeof write>;
    try {
      rows = await write;
    } finally {
      this.writing.delete(write);
    }
    const answeredAt = this.now();
    if (this.left) return;
    const dbNow = Number(rows[0]?.db_now_ms);
    if (!Number.isFinite(dbNow)) throw new Error('the membership heartbeat returned no instant');
    // Every row but this instance's own live one: the others, and the departures (this member
    // id's previous incarnation among them).
    const others = rows
      .filter((row) => !(row.member === this.self && row.live === true))
      .map((row) => ({
        member: String(row.member),
        heartbeatAt: Number(row.heartbeat_ms),
        live: row.live === true,
        incarnation: String(row.incarnation),
      }));
    // Members as processes: one restarted under its id may have registered other jobs.
    const live = new Set([
      this.self,
      ...others.filter((o) => o.live).map((o) => `${o.member}\u0000${o.incarnation}`),
    ]);
    const changed = !sameMembers(live, this.live);
    const reread = this.reread;
    if (changed || reread) {
      // A failure rejects the beat: the view keeps its members, and the next beat tries again.
      await this.membersChanged?.(
        new Set([this.self, ...others.filter((o) => o.live).map((o) => o.member)]),
      );
      if (this.left) return;
      this.live = live;
      this.reread = false;
    }
    this.view.update(others, dbNow, at);
    // The same member ids may stand for new processes: their owners are worked out again too.
    if (changed || reread) this.view.registrationsChanged();
    this.previousReadMs = dbNow;
    this.previousAnswerAt = answeredAt;
    this.beats++;
  }

  /** Has the next beat read the registrations again (`membersChanged`), members changed or not. */
  rereadRegistrations(): void {
    this.reread = true;
  }

  /** Removes rows long gone, once every {@link PRUNE_AFTER_TTLS} beats (any member may). */
  async prune(): Promise<void> {
    if (this.beats === 0 || this.beats % PRUNE_AFTER_TTLS !== 0) return;
    await this.run(pruneMembersStatement(this.scope, PRUNE_AFTER_TTLS * this.settings.ttlMs));
  }

  /**
   * Leaves the namespace (the scheduler stops): successors owe its ticks from `departedAt` (this
   * clock; default now, and never later) — the stop, or the oldest tick the scheduler was still
   * deciding — even when the leave is written later (a beat in flight waited for; a pool used up
   * by running tasks): the ticks between were decided by nobody. That instant is dated on the
   * database's clock from the last beat's read: that read's instant plus the time from its answer
   * to `departedAt` (this clock), which is never later than `departedAt` (the read happened
   * before its answer came). No beat is sent from now on; one already sent is waited for first
   * (answered or failed), else it could land after the leave and keep the row live for a TTL more.
   */
  async leave(departedAt?: number): Promise<void> {
    const stoppedAt = Math.min(this.now(), departedAt ?? Number.POSITIVE_INFINITY);
    this.left = true;
    const departedMs =
      this.previousReadMs === null
        ? null
        : this.previousReadMs + (stoppedAt - this.previousAnswerAt);
    await Promise.allSettled([...this.writing]);
    await this.run(memberLeaveStatement(this.scope, this.self, departedMs));
  }
}

const sameMembers = (a: ReadonlySet<string>, b: ReadonlySet<string>): boolean =>
  a.size === b.size && [...a].every((m) => b.has(m));
