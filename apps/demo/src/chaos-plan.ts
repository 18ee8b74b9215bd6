/**
 * What a chaos run does, decided before it starts: the jobs every worker registers, the lease
 * they contend for, and the fault schedule drawn from a seeded generator — the same seed gives
 * the same faults at the same offsets, so a failure can be replayed.
 */

/** The name of chaos job `j`: all per-second, transaction mode. */
export const chaosJobName = (j: number) => `chaos-${String(j).padStart(2, '0')}`;

/** The name of lease-mode chaos job `j` (the failover run's): per-second, lease mode. */
export const chaosLeaseJobName = (j: number) => `chaos-lease-${String(j).padStart(2, '0')}`;

/** The lease settings of the lease-mode chaos jobs: short, so that a takeover is quick. */
export const CHAOS_LEASE_JOB = { ttlMs: 3000, workMs: 50 } as const;

/** The one long job the workers contend for with leases. */
export const CHAOS_LEASE = {
  namespace: 'chaos',
  jobKey: 'long-export',
  ttlMs: 3000,
  /** A holder writes one fenced row per step. */
  steps: 6,
  stepMs: 400,
} as const;

/** Every kind of fault the injector knows. */
export const FAULT_KINDS = [
  'kill', // SIGKILL a worker; a new one takes its place shortly after
  'stop', // SIGSTOP a worker for a while (a long GC pause, a frozen container), then SIGCONT
  'terminate', // pg_terminate_backend on a backend holding an advisory lock
  'restart', // crash the PostgreSQL server (every connection cut), keep it down 3–5 s, start it
  'drop', // the network between one worker and Postgres drops every connection
  'stall', // the network between one worker and Postgres stops carrying bytes for a while
  'skew', // one worker's clock jumps to a new offset
] as const;

/** One of {@link FAULT_KINDS}. */
export type FaultKind = (typeof FAULT_KINDS)[number];

/** A fault at an offset from the start of the run. */
export interface PlannedFault {
  readonly atMs: number;
  readonly kind: FaultKind;
  /** Which worker slot it hits (kill, stop, drop, stall, skew). */
  readonly slot: number;
  /** How long it lasts (stop, stall, restart: the server's time down), or the new clock offset (skew). */
  readonly amount: number;
}

/** mulberry32: a small, fast, seeded generator of floats in [0, 1). */
export function seededRandom(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/**
 * The faults of a run of `durationMs` with `workers` slots: one every 2–4 s after a quiet first
 * 4 s and before a quiet last 8 s, every kind in each round of seven (shuffled), with at most one
 * server restart per 20 s.
 */
export function planFaults(seed: number, durationMs: number, workers: number): PlannedFault[] {
  const random = seededRandom(seed);
  const pick = (n: number) => Math.floor(random() * n);
  const faults: PlannedFault[] = [];
  let round: FaultKind[] = [];
  let lastRestart = -Infinity;
  for (let at = 4000 + pick(2000); at < durationMs - 8000; at += 2000 + pick(2000)) {
    if (round.length === 0) {
      round = [...FAULT_KINDS];
      for (let i = round.length - 1; i > 0; i--) {
        const j = pick(i + 1);
        [round[i], round[j]] = [round[j] as FaultKind, round[i] as FaultKind];
      }
    }
    let kind = round.shift() as FaultKind;
    if (kind === 'restart' && at - lastRestart < 20_000) kind = 'drop';
    if (kind === 'restart') lastRestart = at;
    const amount =
      kind === 'stop' || kind === 'stall'
        ? 1000 + pick(4000) // 1–5 s: some shorter, some longer than the lease TTL
        : kind === 'skew'
          ? pick(1601) - 800 // ±800 ms
          : kind === 'restart'
            ? // 3–5 s down: longer than the workers' clock spread (±800 ms) plus a tick, so that
              // every worker fails whole ticks. Derived from the offset, not drawn, so that the
              // other faults of a seed stay where they were.
              3000 + (at % 2001)
            : 0;
    faults.push({ atMs: at, kind, slot: pick(workers), amount });
  }
  return faults;
}
