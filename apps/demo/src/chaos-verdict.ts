/**
 * When a chaos run's invariants held: the one rule the verdict's `ok` follows, kept apart from
 * the run so that it can be read, and tested, on its own.
 */

/** What the rule reads of a chaos run's tallies. */
export interface ChaosTallies {
  readonly duplicates: number;
  readonly missed: number;
  readonly failed: number;
  readonly staleWritesAccepted: number;
  readonly tokenViolations: number;
  readonly exclusivityViolations: number;
  readonly leakedLocks: number;
  readonly leakedConnections: number;
  /** Workers that died of an error of their own: no fault kills a worker that way. */
  readonly workerCrashes: readonly unknown[];
  /** How many faults of each kind were applied. */
  readonly faults: Readonly<Record<string, number>>;
}

/**
 * Whether every invariant held: no tick run twice or lost, no failed run, no stale write
 * accepted, fencing tokens in order, never two holders, nothing leaked, no worker crashed of its
 * own error, and every one of `faultKinds` applied at least once (a run that never injected a
 * kind proves nothing about it).
 */
export function invariantsHeld(t: ChaosTallies, faultKinds: readonly string[]): boolean {
  return (
    t.duplicates === 0 &&
    t.missed === 0 &&
    t.failed === 0 &&
    t.staleWritesAccepted === 0 &&
    t.tokenViolations === 0 &&
    t.exclusivityViolations === 0 &&
    t.leakedLocks === 0 &&
    t.leakedConnections === 0 &&
    t.workerCrashes.length === 0 &&
    faultKinds.every((k) => (t.faults[k] ?? 0) > 0)
  );
}
