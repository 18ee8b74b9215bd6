/**
 * `CronMask` reads an expression only when croner reads it alike, and then answers croner's next
 * ticks in UTC: over generated expressions of numbers, `*`, `?`, ranges, steps and lists (values
 * out of range, zero and oversized steps, reversed ranges and stray characters among them), both
 * day-field rules, and instants from 1970 to 2080.
 */
import { Cron } from 'croner';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { CronMask } from './cron-mask.js';
import { cronerParseCount, parseSchedule } from './cron-schedule.js';

// The same generated cases on every run (LOCKKIT_PROPERTY_SEED=<n> explores another seed).
const propertySeed = Number(process.env.LOCKKIT_PROPERTY_SEED ?? 20261203);

/** One item of a field's list, around the field's range [min, max] and a little past it. */
function item(min: number, max: number): fc.Arbitrary<string> {
  // Mostly in range; now and then one past either end (croner refuses it, so must the mask).
  const n = fc.oneof(
    { weight: 12, arbitrary: fc.integer({ min, max }) },
    { weight: 1, arbitrary: fc.constantFrom(Math.max(0, min - 1), max + 1) },
  );
  const step = fc.oneof(
    { weight: 12, arbitrary: fc.integer({ min: 1, max: max + 1 }) },
    { weight: 1, arbitrary: fc.constantFrom(0, max + 2) },
  );
  return fc.oneof(
    { weight: 8, arbitrary: n.map(String) },
    { weight: 6, arbitrary: fc.constant('*') },
    { weight: 4, arbitrary: fc.tuple(n, n).map(([a, b]) => `${Math.min(a, b)}-${Math.max(a, b)}`) },
    { weight: 1, arbitrary: fc.tuple(n, n).map(([a, b]) => `${a}-${b}`) },
    {
      weight: 3,
      arbitrary: fc
        .tuple(n, n, step)
        .map(([a, b, k]) => `${Math.min(a, b)}-${Math.max(a, b)}/${k}`),
    },
    { weight: 3, arbitrary: step.map((k) => `*/${k}`) },
    { weight: 1, arbitrary: fc.tuple(n, step).map(([a, k]) => `${a}/${k}`) },
    {
      weight: 1,
      arbitrary: fc.constantFrom('?', 'L', '5W', '1#2', 'MON', 'jan', '', '1-2-3', '0x1', '+1'),
    },
  );
}

/** A field: mostly one item, sometimes a list. */
function field(min: number, max: number): fc.Arbitrary<string> {
  return fc.oneof(
    { weight: 3, arbitrary: item(min, max) },
    {
      weight: 1,
      arbitrary: fc.array(item(min, max), { minLength: 2, maxLength: 4 }).map((a) => a.join(',')),
    },
  );
}

const expression = fc
  .tuple(
    fc.boolean(),
    field(0, 59),
    field(0, 59),
    field(0, 23),
    field(1, 31),
    field(1, 12),
    field(0, 7),
  )
  .map(([five, s, m, h, dom, mon, dow]) =>
    five ? `${m} ${h} ${dom} ${mon} ${dow}` : `${s} ${m} ${h} ${dom} ${mon} ${dow}`,
  );

const sample = fc.record({
  expression,
  domAndDow: fc.boolean(),
  from: fc.integer({ min: 0, max: Date.UTC(2080, 0, 1) }),
});

describe('CronMask against a plain croner in UTC (property)', () => {
  it('reads only what croner reads, and answers the same next ticks', () => {
    let read = 0;
    fc.assert(
      fc.property(sample, (s) => {
        const mask = CronMask.read(s.expression, s.domAndDow);
        let plain: Cron;
        try {
          plain = new Cron(s.expression, { paused: true, utcOffset: 0, domAndDow: s.domAndDow });
        } catch {
          expect(mask).toBeUndefined();
          return;
        }
        if (mask === undefined) return; // croner's to read: names, L, W, #, `5/15` and such
        read++;
        let after = s.from;
        for (let i = 0; i < 5; i++) {
          const theirs = plain.nextRun(new Date(after))?.getTime() ?? null;
          expect(mask.nextAfter(after)).toBe(theirs);
          if (theirs === null) break;
          // From the tick itself, and from just before the next whole second.
          after = i % 2 === 0 ? theirs : theirs + 999;
        }
      }),
      { seed: propertySeed, numRuns: 3000 },
    );
    // The generator must exercise the masks, not only croner's refusals.
    expect(read).toBeGreaterThan(500);
  });

  it('the ticks of expressions schedulers use, over 30 years, and one that never fires', () => {
    const from = Date.UTC(2001, 0, 1);
    for (const expression of [
      '0 0 0 29 2 *',
      '0 0 9-17 * * 1-5',
      '0 9 1-7 * 1',
      '*/15 * * * *',
      '0 0 0 13 * 5',
      '30 59 23 31 * *',
      '0 0 12 * * 0,7',
    ]) {
      for (const domAndDow of [false, true]) {
        const mask = CronMask.read(expression, domAndDow) as CronMask;
        const plain = new Cron(expression, { paused: true, utcOffset: 0, domAndDow });
        let after = from;
        for (const tick of plain.nextRuns(300, new Date(from))) {
          expect(mask.nextAfter(after)).toBe(tick.getTime());
          after = tick.getTime();
        }
      }
    }
    expect(CronMask.read('0 0 0 30 2 *', false)?.nextAfter(from)).toBeNull();
  });

  it('parseSchedule reads a plain UTC expression without a croner parse, and another with one', () => {
    const before = cronerParseCount();
    const from = new Date(Date.UTC(2027, 0, 1));
    for (let j = 0; j < 1000; j++)
      parseSchedule(`${j % 60} ${Math.floor(j / 60)} 5 * * *`, {}, from);
    parseSchedule('0 0 * * * *', { timezone: 'Etc/UTC', domAndDow: true }, from);
    expect(cronerParseCount()).toBe(before);
    parseSchedule('0 0 12 L * *', {}, from);
    parseSchedule('0 0 12 * * *', { timezone: 'Europe/Oslo' }, from);
    expect(cronerParseCount()).toBe(before + 2);
  });
});
