/**
 * The invariants every faulted run of a lock operation must keep, judged from outside: what the
 * call reported against what the database holds, and what the call left behind (advisory locks,
 * checked-out or in-transaction connections). Used by the fault-point group.
 */
import { isLockkitError, type JobResult } from '@lockkit/core';
import type { AdapterInstance, Observer } from './harness.js';

/** How one call settled: its result, or what it threw. */
export type Settled =
  | { readonly kind: 'resolved'; readonly value: JobResult<unknown> }
  | { readonly kind: 'rejected'; readonly error: unknown };

/** Settles `promise` into a {@link Settled}, never rejecting. */
export function settle(promise: Promise<JobResult<unknown>>): Promise<Settled> {
  return promise.then(
    (value) => ({ kind: 'resolved', value }),
    (error: unknown) => ({ kind: 'rejected', error }),
  );
}

/** A short, stable name of an outcome: `executed`, `skipped`, or the error's code (or class). */
export function outcomeName(outcome: Settled): string {
  if (outcome.kind === 'resolved') return outcome.value.executed ? 'executed' : 'skipped';
  const error = outcome.error;
  if (isLockkitError(error)) return error.code;
  return `not a LockkitError: ${error instanceof Error ? `${error.name}: ${error.message}` : String(error)}`;
}

/** What the judge needs to know about the operation besides its outcome. */
export interface TruthRules {
  /**
   * Whether the task's work commits with the lock's transaction (transaction scope): then any
   * error but `COMMIT_OUTCOME_UNKNOWN` and `AFTER_COMMIT_FAILED` means nothing was written. In
   * session scope the task's writes commit on their own, and an error after them is no lie.
   */
  readonly workCommitsWithLock: boolean;
  /** Error codes that tell the truth about this fault (any other error is a violation). */
  readonly honestCodes: readonly string[];
}

/**
 * Judges what a call reported against whether its work is in the database. Returns the
 * violations, empty when the call told the truth: never `executed: true` unless the work
 * committed, never a skip with no rival, only typed errors with an honest code, and no error
 * but "outcome unknown" (or "committed, then failed") when the work did commit with the lock.
 */
export function judgeTruth(outcome: Settled, committed: boolean, rules: TruthRules): string[] {
  if (outcome.kind === 'resolved') {
    if (!outcome.value.executed)
      return ['skipped ({ executed: false }) with no rival holding the lock'];
    return committed ? [] : ['executed: true, but the work is not in the database'];
  }
  const error = outcome.error;
  if (!isLockkitError(error)) return [`rejected with ${outcomeName(outcome)}`];
  const violations: string[] = [];
  if (!rules.honestCodes.includes(error.code))
    violations.push(
      `rejected ${error.code}, not one of ${rules.honestCodes.join(', ')}: ${error.message}`,
    );
  if (error.code === 'AFTER_COMMIT_FAILED' && !committed)
    violations.push('rejected AFTER_COMMIT_FAILED, but the work is not in the database');
  if (
    rules.workCommitsWithLock &&
    committed &&
    error.code !== 'COMMIT_OUTCOME_UNKNOWN' &&
    error.code !== 'AFTER_COMMIT_FAILED'
  )
    violations.push(`rejected ${error.code}, but the work committed`);
  return violations;
}

/**
 * Checks what a settled call left behind, waiting (by polling the catalog, bounded) for what
 * Postgres and the pool free a moment after the call: no advisory lock held or awaited by the
 * test's connections, none of them idle in a transaction, none still checked out of the pool.
 * Returns the violations.
 */
export async function judgeLeftovers(
  observer: Observer,
  applicationName: string,
  instance: Pick<AdapterInstance<unknown, unknown>, 'checkedOut'>,
): Promise<string[]> {
  const violations: string[] = [];
  let checkedOut = 0;
  const returned = await observer.until(async () => {
    checkedOut = (await instance.checkedOut?.()) ?? 0;
    return checkedOut === 0;
  }, 2000);
  if (!returned) violations.push(`${checkedOut} connection(s) still checked out of the pool`);
  let locks: string[] = [];
  const freed = await observer.until(async () => {
    locks = (await observer.locksOf(applicationName)).map(
      (l) => `${l.key} ${l.mode} granted=${l.granted}`,
    );
    return locks.length === 0;
  }, 2000);
  if (!freed) violations.push(`advisory locks left behind: ${locks.join('; ')}`);
  let busy: string[] = [];
  const clean = await observer.until(async () => {
    busy = (await observer.busyConnectionsOf(applicationName)).map(
      (b) => `pid ${b.pid} ${b.state}: ${b.query}`,
    );
    return busy.length === 0;
  }, 2000);
  if (!clean) violations.push(`connections left inside a transaction: ${busy.join('; ')}`);
  return violations;
}
