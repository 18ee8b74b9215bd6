/**
 * The per-field tables of parsed schedules are shared, and croner still has the shape that
 * sharing relies on: if a croner upgrade changes its pattern's tables, these tests fail instead of
 * 10,000 distinct schedules silently costing 800 MB again.
 */
import { Cron } from 'croner';
import { describe, expect, it } from 'vitest';
import { parseSchedule } from './cron-schedule.js';
import { CRON_TABLE_FIELDS, type CronTableField, shareCronTables } from './cron-tables.js';

type Pattern = Record<CronTableField, readonly number[]>;

const patternOf = (cron: Cron): Pattern =>
  (cron as unknown as { _states: { pattern: Pattern } })._states.pattern;

/** croner's parse of a schedule as the scheduler reads it (the one held for it). */
const parsed = (cron: string, options: Parameters<typeof parseSchedule>[1]): Cron =>
  parseSchedule(cron, options).cron();

const FIELDS = Object.keys(CRON_TABLE_FIELDS) as CronTableField[];

describe('croner tables', () => {
  it("croner's parsed pattern has one plain table per field, of the expected lengths", () => {
    for (const expression of ['* * * * * *', '0 0 12 L 2 *', '0 0 0 1 1 * 2031', '0 9 * * MON#2']) {
      const pattern = patternOf(new Cron(expression, { paused: true, timezone: 'UTC' }));
      for (const field of FIELDS) {
        const table = pattern[field];
        expect(Array.isArray(table), `${expression}: ${field}`).toBe(true);
        expect(table.length, `${expression}: ${field}`).toBe(CRON_TABLE_FIELDS[field]);
        for (const value of table) expect(Number.isInteger(value)).toBe(true);
      }
    }
  });

  it('distinct schedules share one table per field content: one year table for all, ~80 KB', () => {
    const a = parsed('1 2 3 4 5 *', {});
    const b = parsed('59 58 * 1 6 *', { timezone: 'Europe/Oslo' });
    const c = parsed('0 0 0 1 1 * 2031', {});
    const d = parsed('30 0 0 1 1 * 2031', { domAndDow: true });
    expect(patternOf(a).year).toBe(patternOf(b).year);
    expect(patternOf(c).year).toBe(patternOf(d).year);
    expect(patternOf(a).year).not.toBe(patternOf(c).year);
    expect(patternOf(a).year[2031]).toBe(1);
    expect(patternOf(c).year[2030]).toBe(0);
    expect(patternOf(c).year[2031]).toBe(1);
    // Fields of equal content, from different expressions: second 0 and 30 differ, minute 0 is one.
    expect(patternOf(c).minute).toBe(patternOf(d).minute);
    expect(patternOf(c).second).not.toBe(patternOf(d).second);
    expect(patternOf(a).nearestWeekdays).toBe(patternOf(b).nearestWeekdays);
  });

  it('a plain croner is made to share its tables, every field, and its answers stay the same', () => {
    const plain = new Cron('0 30 2 * * 1-5', { paused: true, timezone: 'America/New_York' });
    const shared = new Cron('0 30 2 * * 1-5', { paused: true, timezone: 'America/New_York' });
    const before = FIELDS.map((field) => [...patternOf(shared)[field]]);
    expect(shareCronTables(shared)).toBe(true);
    const again = new Cron('0 30 2 * * 1-5', { paused: true, timezone: 'America/New_York' });
    expect(shareCronTables(again)).toBe(true);
    FIELDS.forEach((field, i) => {
      expect(patternOf(again)[field], field).toBe(patternOf(shared)[field]);
      expect([...patternOf(shared)[field]], field).toEqual(before[i]);
    });
    const from = new Date(Date.UTC(2027, 2, 1));
    expect(shared.nextRuns(40, from)).toEqual(plain.nextRuns(40, from));
    expect(shared.previousRuns(40, from)).toEqual(plain.previousRuns(40, from));
  });

  it("schedules read alike share croner's completed options object, read apart do not", () => {
    const optionsOf = (cron: Cron) => (cron as unknown as { options: object }).options;
    const a = parsed('1 2 3 * * *', { timezone: 'Asia/Tokyo' });
    const b = parsed('4 5 6 * * *', { timezone: 'Asia/Tokyo' });
    const c = parsed('4 5 6 * * *', { timezone: 'Asia/Tokyo', domAndDow: true });
    expect(optionsOf(a)).toBe(optionsOf(b));
    expect(optionsOf(c)).not.toBe(optionsOf(a));
    // Completed twice, the object holds what croner completes a fresh one to.
    const plain = new Cron('4 5 6 * * *', { paused: true, timezone: 'Asia/Tokyo' });
    expect({ ...optionsOf(b) }).toEqual({ ...optionsOf(plain) });
  });

  it('shared tables are frozen: a write into one (a later croner writing after parse) throws', () => {
    const year = patternOf(parsed('0 0 * * * *', {})).year as number[];
    expect(Object.isFrozen(year)).toBe(true);
    expect(() => {
      year[2040] = 0;
    }).toThrow(TypeError);
    expect(year[2040]).toBe(1);
  });

  it('a pattern of another shape is left alone and reported, not half shared', () => {
    const cron = new Cron('0 0 * * * *', { paused: true });
    const pattern = patternOf(cron) as unknown as Record<string, unknown>;
    const minute = pattern.minute;
    pattern.year = new Uint8Array(10_000);
    expect(shareCronTables(cron)).toBe(false);
    expect(pattern.minute).toBe(minute);
  });
});
