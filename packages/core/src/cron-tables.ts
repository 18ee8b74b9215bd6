/**
 * One copy of each of croner's per-field tables, whatever the number of schedules.
 *
 * croner 11 parses an expression into a `CronPattern` of flat 0/1 (or bit-mask) tables, one per
 * field: 60 seconds, 60 minutes, 24 hours, 31 days, 12 months, the weekdays, 31 "nearest weekday"
 * flags and 10,000 years. The year table alone is ~80 KB, and it is the same for every expression
 * without a year field, so 10,000 distinct schedules held 800 MB of identical years. croner reads
 * these tables and never writes them once the pattern is built (checked against the pinned
 * version: only the pattern's own parse writes them), so patterns with equal tables can share one.
 *
 * The shared tables are frozen: should a later croner write into a parsed pattern, that write
 * throws (croner's module is strict) instead of changing another schedule. `cron-tables.test.ts`
 * fails if croner's pattern stops having the shape this relies on, so memory cannot grow back
 * unnoticed.
 *
 * @packageDocumentation
 */
import type { Cron } from 'croner';

/** The fields of croner's `CronPattern` that hold a table, and the length each table has. */
export const CRON_TABLE_FIELDS = Object.freeze({
  second: 60,
  minute: 60,
  hour: 24,
  day: 31,
  month: 12,
  dayOfWeek: 7,
  year: 10_000,
  nearestWeekdays: 31,
} as const);

/** A field of croner's pattern that holds a table. */
export type CronTableField = keyof typeof CRON_TABLE_FIELDS;

/** The part of a parsed `Cron` this module reaches into: `_states.pattern`, croner's own field. */
interface CronInternals {
  readonly _states?: { readonly pattern?: Record<string, unknown> };
}

/** Every table handed out so far, by field and content (see {@link tableKey}). */
const shared = new Map<string, readonly number[]>();

/**
 * A key equal for two tables exactly when they hold the same numbers in the same places: the
 * field, then the content as runs of equal values (`index:value` where a run starts), so that a
 * 10,000-entry year table of ones is one short string. `undefined` when an entry is not a small
 * non-negative integer (a shape this module does not know).
 */
function tableKey(field: CronTableField, table: readonly unknown[]): string | undefined {
  let key = `${field}/${table.length}`;
  let previous: unknown;
  for (let i = 0; i < table.length; i++) {
    const value = table[i];
    if (typeof value !== 'number' || !Number.isInteger(value) || value < 0 || value > 255) {
      return undefined;
    }
    if (value !== previous) key += ` ${i}:${value}`;
    previous = value;
  }
  return key;
}

/**
 * The tables of a parsed pattern that this module would share, or `undefined` when the pattern
 * does not have croner 11's shape (a table missing, of another length, or holding other values).
 */
function tablesOf(cron: Cron): Map<CronTableField, string> | undefined {
  const pattern = (cron as unknown as CronInternals)._states?.pattern;
  if (pattern === undefined || pattern === null) return undefined;
  const keys = new Map<CronTableField, string>();
  for (const [field, length] of Object.entries(CRON_TABLE_FIELDS) as [CronTableField, number][]) {
    const table = pattern[field];
    if (!Array.isArray(table) || table.length !== length) return undefined;
    const key = tableKey(field, table);
    if (key === undefined) return undefined;
    keys.set(field, key);
  }
  return keys;
}

/**
 * Replaces each table of `cron`'s parsed pattern by the one frozen copy of a table with the same
 * content, so that schedules cost a few hundred bytes each instead of ~82 KB. Every answer of the
 * schedule stays the same: the tables are equal entry by entry.
 *
 * @returns `true` when the tables are shared; `false`, leaving `cron` untouched, when its pattern
 * does not have the shape of the pinned croner (a test guards that this never happens).
 */
export function shareCronTables(cron: Cron): boolean {
  const keys = tablesOf(cron);
  if (keys === undefined) return false;
  const pattern = (cron as unknown as CronInternals)._states?.pattern as Record<string, unknown>;
  for (const [field, key] of keys) {
    let table = shared.get(key);
    if (table === undefined) {
      table = Object.freeze(pattern[field] as number[]);
      shared.set(key, table);
    }
    pattern[field] = table;
  }
  return true;
}

/** How many distinct tables are shared in this process: for tests and memory probes. */
export function sharedCronTableCount(): number {
  return shared.size;
}
