/**
 * What `createScheduler` and `register` refuse, at once and typed (OPTION_INVALID), and how they
 * read a schedule: UTC unless told otherwise (this package's tests run with a non-UTC host zone,
 * see vitest.config.ts), never a schedule that cannot fire, and a jitter below half the
 * smallest gap between two ticks, DST changes within the next year included.
 */
import { describe, expect, it } from 'vitest';
import { SimulatedClock } from './clock.js';
import { parseSchedule } from './cron-schedule.js';
import { jobKey } from './job-name.js';
import type { LockClient } from './lock.js';
import { createScheduler } from './scheduler.js';
import { SCHEDULER_NAMESPACE } from './scheduler-namespace.js';

/** Registration never touches the database: a client with a schema is enough. */
const locks = { schema: 'lockkit_unused' } as unknown as LockClient<unknown, unknown>;
const noop = () => {};
const invalid = expect.objectContaining({ name: 'LockkitError', code: 'OPTION_INVALID' });
const at = (iso: string) => new SimulatedClock(Date.parse(iso));

describe('schedule reading', () => {
  it('runs under a non-UTC host zone (the guard for every test below)', () => {
    expect(new Date(Date.UTC(2027, 0, 1)).getTimezoneOffset()).not.toBe(0);
  });

  it('reads a cron expression in UTC when no timezone is given, whatever the host zone', () => {
    const from = new Date(Date.UTC(2027, 0, 1, 12));
    expect(parseSchedule('0 0 3 * * *', {}).nextRun(from)?.toISOString()).toBe(
      '2027-01-02T03:00:00.000Z',
    );
    expect(
      parseSchedule('0 0 3 * * *', { timezone: 'Asia/Tokyo' }).nextRun(from)?.toISOString(),
    ).toBe('2027-01-01T18:00:00.000Z');
  });

  it('registers a job without a timezone on UTC ticks', () => {
    const s = createScheduler(locks, { clock: at('2027-01-01T12:00:00Z') });
    s.register('daily', '0 0 3 * * *', noop);
    // The job as a tick reads it, made from its row (the scheduler keeps rows, not job objects).
    const internals = s as unknown as {
      rowOf(name: string): number;
      jobAt(row: number): { cron: { nextRun(d: Date): Date } };
    };
    const job = internals.jobAt(internals.rowOf('daily'));
    expect(job.cron.nextRun(new Date('2027-01-01T12:00:00Z')).toISOString()).toBe(
      '2027-01-02T03:00:00.000Z',
    );
  });
});

describe('register refuses at once, typed', () => {
  const refused: [string, unknown[]][] = [
    ['options null', ['a', '* * * * * *', noop, null]],
    ['options a string', ['a', '* * * * * *', noop, 'lease']],
    ['options an array', ['a', '* * * * * *', noop, []]],
    ['catchUp {}', ['a', '* * * * * *', noop, { catchUp: {} }]],
    [
      'catchUp { withinMs: undefined }',
      ['a', '* * * * * *', noop, { catchUp: { withinMs: undefined } }],
    ],
    ['catchUp []', ['a', '* * * * * *', noop, { catchUp: [] }]],
    [
      'catchUp { withinMs: NaN }',
      ['a', '* * * * * *', noop, { catchUp: { withinMs: Number.NaN } }],
    ],
    ['catchUp null', ['a', '* * * * * *', noop, { catchUp: null }]],
    ['timezone empty', ['a', '* * * * * *', noop, { timezone: '' }]],
    ['lease null', ['a', '* * * * * *', noop, { mode: 'lease', lease: null }]],
    ['30 February', ['a', '0 0 0 30 2 *', noop, {}]],
    ['31 April', ['a', '0 0 0 31 4 *', noop, {}]],
    ['a past year', ['a', '0 0 0 1 1 * 2001', noop, {}]],
    ['jitter at half the gap', ['a', '* * * * * *', noop, { jitterMs: 500 }]],
    ['jitter at half a minute', ['a', '0 * * * * *', noop, { jitterMs: 30_000 }]],
  ];
  for (const [label, args] of refused) {
    it(label, () => {
      const s = createScheduler(locks, { clock: at('2027-01-01T00:00:00Z') });
      const register = s.register.bind(s) as (...a: unknown[]) => unknown;
      expect(() => register(...args)).toThrow(invalid);
    });
  }

  it('two names whose lock keys collide, naming both', () => {
    // A birthday search over 32-bit key numbers: a colliding pair within ~100,000 names.
    const seen = new Map<number, string>();
    let pair: [string, string] | undefined;
    for (let i = 0; pair === undefined; i++) {
      const name = `job-${i}`;
      const id = jobKey(SCHEDULER_NAMESPACE, name).pgLocks.objid;
      const other = seen.get(id);
      if (other === undefined) seen.set(id, name);
      else pair = [other, name];
    }
    const s = createScheduler(locks, { clock: at('2027-01-01T00:00:00Z') });
    s.register('unrelated', '0 0 * * * *', noop);
    s.register(pair[0], '0 0 * * * *', noop);
    expect(() => s.register(pair[1], '0 0 * * * *', noop)).toThrow(
      expect.objectContaining({
        code: 'OPTION_INVALID',
        message: expect.stringContaining(`"${pair[1]}" and "${pair[0]}" hash to the same lock key`),
      }),
    );
  });

  it('accepts a jitter just below half the smallest gap, and a year still to come', () => {
    const s = createScheduler(locks, { clock: at('2027-01-01T00:00:00Z') });
    s.register('second', '* * * * * *', noop, { jitterMs: 499 });
    s.register('minute', '0 * * * * *', noop, { jitterMs: 29_999 });
    s.register('once', '0 0 0 1 1 * 2030', noop);
  });

  it('measures the jitter bound over a DST change more than 1,000 ticks away', () => {
    // 3-hourly in New York: 8 ticks a day, so the March 2027 change is ~2,300 ticks after June
    // 2026; there a gap is 2 h, so the bound is 1 h.
    const s = createScheduler(locks, { clock: at('2026-06-01T00:00:00Z') });
    expect(() =>
      s.register('3h', '0 0 */3 * * *', noop, {
        jitterMs: 2.5 * 3600_000,
        timezone: 'America/New_York',
      }),
    ).toThrow(invalid);
    s.register('3h-ok', '0 0 */3 * * *', noop, {
      jitterMs: 3600_000 - 1,
      timezone: 'America/New_York',
    });
  });
});

describe('createScheduler refuses at once, typed', () => {
  const bad: [string, unknown][] = [
    ['options null', null],
    ['options a string', 'x'],
    ['a clock without setTimer', { clock: { now: () => 0 } }],
    ['a clock without now', { clock: { setTimer: () => ({ cancel: noop }) } }],
    ['a clock that is null', { clock: null }],
    ['now not a function', { now: 'x' }],
    ['an unknown distribution', { distribution: 'leader' }],
    ['memberTtlMs without owned distribution', { memberTtlMs: 3000 }],
    ['memberTtlMs below 300 ms', { distribution: 'owned', memberTtlMs: 299 }],
    // A dead member's ticks are owed for 60 s: its death must be seen well within that.
    ['memberTtlMs above 30 s', { distribution: 'owned', memberTtlMs: 30_001 }],
    ['memberTtlMs not an integer', { distribution: 'owned', memberTtlMs: 1000.5 }],
  ];
  for (const [label, options] of bad) {
    it(label, () => {
      const create = createScheduler as (l: unknown, o: unknown) => unknown;
      expect(() => create(locks, options)).toThrow(invalid);
    });
  }
  it('takes memberTtlMs from 300 ms to 30 s with owned distribution', () => {
    for (const memberTtlMs of [300, 30_000])
      expect(() => createScheduler(locks, { distribution: 'owned', memberTtlMs })).not.toThrow();
  });
});

describe('runTick refuses, before any SQL', () => {
  it('an invalid Date and a tick the schedule never produces', async () => {
    const s = createScheduler(locks, { clock: at('2027-01-01T12:00:00Z') });
    s.register('every-10s', '*/10 * * * * *', noop);
    for (const tick of [
      new Date(Number.NaN),
      'not a date' as unknown as Date,
      new Date('2027-01-01T12:00:03Z'),
      new Date('2027-01-01T12:00:10.500Z'),
      new Date('2027-01-01T12:00:00.001Z'),
    ]) {
      await expect(s.runTick('every-10s', tick), String(tick)).rejects.toEqual(invalid);
    }
  });
});

describe('lease settings and owners checked before any SQL', () => {
  it('refuses a lease-mode job whose renewals are due later than half of ttlMs − safetyMarginMs', () => {
    const s = createScheduler(locks, { clock: at('2027-01-01T12:00:00Z') });
    expect(() =>
      s.register('late-renewal', '* * * * * *', noop, {
        mode: 'lease',
        lease: { ttlMs: 1000, safetyMarginMs: 200, renewEveryMs: 800 },
      }),
    ).toThrow(invalid);
    expect(() =>
      s.register('at-the-bound', '* * * * * *', noop, {
        mode: 'lease',
        lease: { ttlMs: 1000, safetyMarginMs: 200, renewEveryMs: 400 },
      }),
    ).not.toThrow();
  });

  it.each([
    ['a NUL', 'pod\u00001'],
    ['a lone surrogate', 'pod\udc00'],
    ['nothing', ''],
    ['a number', 7],
  ])('createScheduler refuses an owner of %s with OPTION_INVALID', (_label, owner) => {
    expect(() => createScheduler(locks, { owner: owner as string })).toThrow(invalid);
  });
});
