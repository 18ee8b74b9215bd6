import { LockkitError } from '@lockkit/core';

/** The capability groups of the suite, in the order they are declared. */
export const CONFORMANCE_GROUPS = [
  'transaction',
  'session',
  'pipelining',
  'robustness',
  'truth',
  'leases',
  'scheduler',
  'engine',
  'standby',
  'faults',
  'dead-start',
] as const;

/** The capability groups of the suite. */
export type ConformanceGroup = (typeof CONFORMANCE_GROUPS)[number];

/** Options of {@link runConformance}. */
export interface RunConformanceOptions {
  /** Run only these groups (e.g. through a transaction pooler, where session scope is unsafe). */
  readonly groups?: readonly ConformanceGroup[];
  /**
   * How long the scheduler's worker-process case runs, in seconds (default 12; a whole number from
   * 8). The environment variable `LOCKKIT_TEST_SCHEDULER_SECONDS` overrides it: a CI pass that
   * repeats a suite whose long run another pass already made (Node 22 and 24 after the main passes)
   * runs it short.
   */
  readonly schedulerSeconds?: number;
  /**
   * Also search the scheduler and migration fault points (`faults.scheduler-*`, `faults.migrate.*`):
   * every statement boundary of a tick and of a migration under every fault, a few hundred
   * combinations and one to three minutes per pass. Default false: the cases are then skipped
   * visibly. Worth it for every adapter, not once per driver: an ORM gives connections back to the
   * pool its own way (Kysely and TypeORM lent a terminated backend's connection again, which
   * node-postgres alone never showed). `'through-pgbouncer'`: only in the PgBouncer groups, the
   * direct ones skipped visibly — for a second configuration of an adapter whose first one
   * searches them directly (postgres.js with `prepare: false`, the setting PgBouncer needs).
   */
  readonly schedulerFaultPoints?: boolean | 'through-pgbouncer';
}

/** Fewer seconds leave the scheduler's worker-process case too few middle ticks to judge. */
const MIN_SCHEDULER_SECONDS = 8;

const invalid = (message: string) => new LockkitError('OPTION_INVALID', message);

/**
 * Checks {@link runConformance}'s options as a plain-JavaScript caller may pass them: a misspelt
 * group or fault-point setting would otherwise skip cases silently (a group that matches no name
 * runs nothing; an unknown `schedulerFaultPoints` string would read as "not enabled"), and the
 * suite would pass having checked less than its caller asked for.
 *
 * @throws LockkitError with code `OPTION_INVALID`, naming the option and the value given.
 */
export function checkConformanceOptions(options: unknown): RunConformanceOptions {
  if (options === undefined) return {};
  if (typeof options !== 'object' || options === null || Array.isArray(options))
    throw invalid(`runConformance options must be an object, got ${shown(options)}.`);
  const known = new Set(['groups', 'schedulerSeconds', 'schedulerFaultPoints']);
  for (const key of Object.keys(options))
    if (!known.has(key))
      throw invalid(`runConformance has no option "${key}" (it takes ${[...known].join(', ')}).`);
  const { groups, schedulerSeconds, schedulerFaultPoints } = options as Record<string, unknown>;
  if (groups !== undefined) {
    if (!Array.isArray(groups) || groups.length === 0)
      throw invalid(
        `runConformance option groups must be a non-empty array of group names, got ${shown(groups)}.`,
      );
    for (const group of groups)
      if (!(CONFORMANCE_GROUPS as readonly unknown[]).includes(group))
        throw invalid(
          `runConformance option groups: ${shown(group)} is not a group (the groups are ${CONFORMANCE_GROUPS.join(', ')}).`,
        );
  }
  if (schedulerSeconds !== undefined)
    checkSchedulerSeconds(schedulerSeconds, 'option schedulerSeconds');
  if (
    schedulerFaultPoints !== undefined &&
    typeof schedulerFaultPoints !== 'boolean' &&
    schedulerFaultPoints !== 'through-pgbouncer'
  )
    throw invalid(
      `runConformance option schedulerFaultPoints must be true, false or 'through-pgbouncer', got ${shown(schedulerFaultPoints)}.`,
    );
  return options as RunConformanceOptions;
}

/** `LOCKKIT_TEST_SCHEDULER_SECONDS`, checked like the option it overrides (or undefined). */
export function schedulerSecondsFromEnv(): number | undefined {
  const raw = process.env.LOCKKIT_TEST_SCHEDULER_SECONDS;
  if (raw === undefined || raw === '') return undefined;
  const seconds = Number(raw);
  checkSchedulerSeconds(seconds, `LOCKKIT_TEST_SCHEDULER_SECONDS ('${raw}')`);
  return seconds;
}

function checkSchedulerSeconds(value: unknown, what: string): void {
  if (typeof value !== 'number' || !Number.isInteger(value) || value < MIN_SCHEDULER_SECONDS)
    throw invalid(
      `runConformance ${what} must be a whole number of seconds from ${MIN_SCHEDULER_SECONDS}, got ${shown(value)}.`,
    );
}

/** A bad option value as an error message shows it. */
function shown(value: unknown): string {
  if (typeof value === 'string') return `'${value}'`;
  if (Array.isArray(value)) return 'an array';
  if (value === null) return 'null';
  return typeof value === 'object' ? 'an object' : String(value);
}
