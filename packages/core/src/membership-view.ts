/**
 * One scheduler instance's view of its namespace's members, for owned distribution: which jobs it
 * decides now, and from when it owes the ticks of jobs whose owner went away.
 *
 * Deciding a tick more than once is safe (the job's lock and the ledger's row let one run it);
 * a tick nobody decides is lost. So every rule here errs towards deciding:
 * - an instance decides a job it owns: the first of the job's succession among the live members
 *   that registered it, itself always counted live;
 * - when it cannot tell (no heartbeat succeeded for `staleMs`: its own row may have expired and a
 *   successor taken over, or not), it decides every job;
 * - a member that died stays its jobs' owner in everyone's view until its row expires, and its
 *   ticks go undecided meanwhile — and so do those of jobs it was about to inherit from another
 *   dead member. So each heartbeat also reads the rows that stopped being live within the
 *   departure window (expired, or left at stop()), and while any is there, the instance owes
 *   every job it comes to own the ticks from the earliest of their last heartbeats on. The
 *   debt is in the database, where a member that joins after the departure reads it too.
 *
 * Liveness is judged by the database's clock (`expires_at > clock_timestamp()`), so skew between
 * instances does not enter it; the debt's instant is turned into this instance's clock with the
 * offset its heartbeat measured.
 *
 * @packageDocumentation
 */
import { ownerOf } from './job-succession.js';

/** The timings of a membership view (ms). */
export interface MembershipTimings {
  /** After how long without a successful heartbeat an instance decides every job. */
  readonly staleMs: number;
}

/** A member's row as a heartbeat reads it. */
export interface MemberRow {
  readonly member: string;
  /** Its last heartbeat (or its stop), on the database's clock (ms). */
  readonly heartbeatAt: number;
  /** Live now: not expired, not left. A row that is not was live within the departure window. */
  readonly live: boolean;
}

/** Who decides each job, as one instance sees its namespace's members. */
export class MembershipView {
  private live: ReadonlySet<string> = new Set();
  private lastSuccess = Number.NEGATIVE_INFINITY;
  /** Owners of jobs every member registered, in this view: computed once a view. */
  private owners = new Map<string, string | undefined>();
  /** Ticks from this instant on (this clock) may be owed; undefined: no recent departure. */
  private debt: number | undefined;
  /**
   * Jobs owned continuously since their debt was paid, with the instant it was paid from: this
   * instance has decided them since. A departure seen later owes more only when it reaches back
   * further — a member that died while it still owned a job in others' views, and whose row
   * expired only after the job came here.
   */
  private readonly paid = new Map<string, number>();

  /**
   * @param registeredOf - the members that registered a job, this one among them (undefined:
   *   every member did); asked again after each change of the live members.
   */
  constructor(
    private readonly self: string,
    private readonly timings: MembershipTimings,
    private readonly registeredOf: (job: string) => ReadonlySet<string> | undefined = () =>
      undefined,
  ) {}

  /**
   * A heartbeat succeeded at `at` (this clock); its statement ran at `dbNow` (the database's
   * clock) and read `rows`: the namespace's live members, and those that stopped being live within
   * the departure window.
   */
  update(rows: Iterable<MemberRow>, dbNow: number, at: number): void {
    const next = new Set<string>([this.self]);
    let departedSince = Number.POSITIVE_INFINITY;
    for (const row of rows) {
      if (row.live) next.add(row.member);
      else departedSince = Math.min(departedSince, row.heartbeatAt);
    }
    this.debt = Number.isFinite(departedSince) ? departedSince - (dbNow - at) : undefined;
    const changed = next.size !== this.live.size || [...next].some((m) => !this.live.has(m));
    if (changed) {
      this.live = next;
      this.owners = new Map();
      // A job given away and taken back later is owed again from the debt of then.
      for (const job of this.paid.keys()) if (this.owner(job) !== this.self) this.paid.delete(job);
    }
    if (this.debt === undefined) this.paid.clear();
    this.lastSuccess = at;
  }

  /** Whether this instance's view is too old to trust at `at`: then it decides every job. */
  stale(at: number): boolean {
    return at - this.lastSuccess >= this.timings.staleMs;
  }

  /** Whether this instance decides `job` at `at`. */
  decides(job: string, at: number): boolean {
    return this.stale(at) || this.owner(job) === this.self;
  }

  /**
   * From when this instance owes `job`'s ticks (this clock), if it does now: it owns the job,
   * a member departed recently, and this debt is not paid yet for the job. Counted as paid once
   * returned: the caller runs, or records per policy, the ticks from then on that the ledger has
   * no row for. Owing more than was lost is harmless: the ledger shows which ticks already ran.
   */
  owedFrom(job: string): number | undefined {
    if (this.debt === undefined || this.owner(job) !== this.self) return undefined;
    const paid = this.paid.get(job);
    if (paid !== undefined && paid <= this.debt) return undefined;
    this.paid.set(job, this.debt);
    return this.debt;
  }

  /** Who registered which job changed (the live members did not): owners are worked out again. */
  registrationsChanged(): void {
    this.owners = new Map();
    for (const job of this.paid.keys()) if (this.owner(job) !== this.self) this.paid.delete(job);
  }

  /**
   * What {@link MembershipView.owedFrom} returned for `job` could not be settled (the caller's
   * statement failed): it is owed again at the next ask, while the departure is still in view.
   */
  unpaid(job: string): void {
    this.paid.delete(job);
  }

  /** The owner of `job` in this view (this instance counts as live). */
  owner(job: string): string | undefined {
    if (this.owners.has(job)) return this.owners.get(job);
    const registered = this.registeredOf(job);
    const owner = ownerOf(
      job,
      registered === undefined ? this.live : [...this.live].filter((m) => registered.has(m)),
    );
    this.owners.set(job, owner);
    return owner;
  }
}
