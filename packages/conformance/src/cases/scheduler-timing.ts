/**
 * The scheduler's time, against a real PostgreSQL: long delays never overflow the timer, jitter
 * is bounded by the schedule, job names the ledger cannot store are refused, node-cron's
 * day-of-month-and-day-of-week meaning is available, and a simulated clock runs years of a
 * schedule through the whole tick path (claim, handler, ledger) in moments.
 */
import {
  createLockClient,
  createScheduler,
  type LockClient,
  type RunInfo,
  type SchedulerEvent,
  SimulatedClock,
} from '@lockkit/core';
import { expect } from 'vitest';
import type { ConformanceAdapter } from '../harness.js';
import { casesOf, type Fixture, withLockkitSchema } from '../suite.js';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Resolves with the `ran` (or `error`) event of `tick` (of `job`, when given). */
function nextRan(
  events: SchedulerEvent[],
  listeners: Set<() => void>,
  tick: number,
  job?: string,
): Promise<SchedulerEvent> {
  return new Promise((resolve) => {
    const check = () => {
      const found = events.find(
        (e) =>
          (e.type === 'ran' || e.type === 'error') &&
          e.tick.getTime() === tick &&
          (job === undefined || e.job === job),
      );
      if (found) {
        listeners.delete(check);
        resolve(found);
      }
    };
    listeners.add(check);
    check();
  });
}

/** Scheduler timing cases. */
export function schedulerTimingCases<Tx, Session>(
  adapter: ConformanceAdapter<Tx, Session>,
  fixture: () => Fixture<Tx, Session>,
): void {
  const test = casesOf(adapter);

  const withSchema = (fn: (schema: string, locks: LockClient<Tx, Session>) => Promise<void>) =>
    withLockkitSchema(fixture(), fn);

  const ledger = (schema: string, job: string) =>
    fixture().observer.query<{ tick: Date; status: string; attempt: number }>(
      `SELECT tick, status, attempt FROM "${schema}".runs WHERE job = $1 ORDER BY tick`,
      [job],
    );

  /** A scheduler whose 'ran'/'error' events are collected and awaitable by tick. */
  const watched = (
    locks: LockClient<Tx, Session>,
    options: Parameters<typeof createScheduler>[1],
  ) => {
    const scheduler = createScheduler(locks, options);
    const events: SchedulerEvent[] = [];
    const listeners = new Set<() => void>();
    for (const type of ['ran', 'error', 'failed', 'skipped-held', 'skipped-done'] as const) {
      scheduler.on(type, (e) => {
        events.push(e);
        for (const l of [...listeners]) l();
      });
    }
    return {
      scheduler,
      events,
      ran: (tick: number, job?: string) => nextRan(events, listeners, tick, job),
    };
  };

  test(
    'scheduler.long-delay',
    'a yearly and a monthly job, started, do not run before their tick (no setTimeout overflow)',
    () =>
      withSchema(async (schema, locks) => {
        const s = createScheduler(locks, { retentionMs: 0 });
        const calls: string[] = [];
        s.register('yearly-report', '0 0 0 1 1 *', (run) => {
          calls.push(`yearly ${run.tick.toISOString()}`);
        });
        s.register('monthly-report', '0 0 0 1 * *', (run) => {
          calls.push(`monthly ${run.tick.toISOString()}`);
        });
        await s.start();
        await sleep(1500);
        await s.stop();
        expect(calls.slice(0, 5), `${calls.length} runs`).toEqual([]);
        expect(await ledger(schema, 'yearly-report')).toEqual([]);
        expect(await ledger(schema, 'monthly-report')).toEqual([]);
      }),
    30_000,
  );

  test(
    'scheduler.simulated-years',
    'on a simulated clock, a yearly job runs exactly once per year over 10 years, through the ledger',
    () =>
      withSchema(async (schema, locks) => {
        const clock = new SimulatedClock(Date.UTC(2026, 11, 31, 23, 59, 59));
        const { scheduler, events, ran } = watched(locks, { clock, retentionMs: 0 });
        const ticks: number[] = [];
        scheduler.register('yearly', '0 0 0 1 1 *', (run) => {
          ticks.push(run.tick.getTime());
        });
        await scheduler.start();
        const due: number[] = [];
        for (let year = 2027; year <= 2036; year++) {
          const tick = Date.UTC(year, 0, 1);
          due.push(tick);
          await clock.advanceTo(tick - 1);
          expect(ticks, `nothing before ${year}`).toEqual(due.slice(0, -1));
          await clock.advanceTo(tick);
          expect(await ran(tick)).toMatchObject({ type: 'ran' });
        }
        await clock.advanceTo(Date.UTC(2037, 0, 1) - 1);
        await scheduler.stop();
        expect(ticks).toEqual(due);
        expect(events.filter((e) => e.type !== 'ran')).toEqual([]);
        const rows = await ledger(schema, 'yearly');
        expect(rows.map((r) => [new Date(r.tick).getTime(), r.status])).toEqual(
          due.map((t) => [t, 'SUCCEEDED']),
        );
      }),
    60_000,
  );

  test(
    'scheduler.jitter-keeps-ticks',
    'on a simulated clock, a per-second job with jitterMs 999 runs every tick exactly once, none before it is due',
    () =>
      withSchema(async (schema, locks) => {
        const start = Date.UTC(2027, 5, 1);
        const clock = new SimulatedClock(start);
        const { scheduler, ran } = watched(locks, { clock, retentionMs: 0 });
        const runs: [number, number][] = [];
        scheduler.register(
          'spread',
          '* * * * * *',
          (run) => void runs.push([run.tick.getTime(), run.lateMs]),
          { jitterMs: 999 },
        );
        await scheduler.start();
        const due: number[] = [];
        for (let i = 1; i <= 30; i++) {
          const tick = start + i * 1000;
          due.push(tick);
          // The latest a jittered tick can fire; each run ends before the clock moves on.
          await clock.advanceTo(tick + 998);
          await ran(tick);
        }
        await scheduler.stop();
        expect(runs.map(([t]) => t)).toEqual(due);
        for (const [, lateMs] of runs) expect(lateMs).toBeLessThan(1000);
        const rows = await ledger(schema, 'spread');
        expect(rows.map((r) => [new Date(r.tick).getTime(), r.status])).toEqual(
          due.map((t) => [t, 'SUCCEEDED']),
        );
      }),
    30_000,
  );

  test(
    'scheduler.unstorable-names',
    'a job name PostgreSQL text cannot store (NUL), a lone surrogate or an over-long name is refused at register',
    async () => {
      const scheduler = createScheduler(createLockClient(fixture().instance.executor));
      const noop = () => {};
      for (const [name, code] of [
        ['nightly\u0000report', 'KEY_MALFORMED'],
        ['\u0000', 'KEY_MALFORMED'],
        ['half \uD800 pair', 'KEY_MALFORMED'],
        ['x'.repeat(1025), 'KEY_TOO_LONG'],
      ] as const) {
        expect(() => scheduler.register(name, '* * * * * *', noop), JSON.stringify(name)).toThrow(
          expect.objectContaining({ name: 'LockKeyError', code }),
        );
      }
      // The refused names left nothing behind: a valid one still registers.
      scheduler.register('nightly report', '* * * * * *', noop);
    },
  );

  test(
    'scheduler.jitter-bound',
    "jitterMs at or above the schedule's smallest gap between ticks is refused at register",
    async () => {
      const scheduler = createScheduler(createLockClient(fixture().instance.executor));
      const noop = () => {};
      for (const [cron, jitterMs, timezone] of [
        ['* * * * * *', 10_000, undefined],
        ['* * * * * *', 1000, undefined],
        ['*/15 * * * *', 15 * 60_000, undefined],
        // A daily job in a DST zone has a 23-hour day each spring.
        ['0 30 1 * * *', 23 * 3600_000 + 1, 'Europe/Oslo'],
      ] as const) {
        expect(
          () =>
            scheduler.register(`j-${cron}-${jitterMs}`, cron, noop, {
              jitterMs,
              ...(timezone && { timezone }),
            }),
          `${cron} jitter ${jitterMs}`,
        ).toThrow(
          expect.objectContaining({
            code: 'OPTION_INVALID',
            message: expect.stringMatching(/jitterMs/),
          }),
        );
      }
      scheduler.register('ok-second', '* * * * * *', noop, { jitterMs: 999 });
      scheduler.register('ok-daily', '0 30 1 * * *', noop, {
        jitterMs: 3600_000,
        timezone: 'Europe/Oslo',
      });
    },
  );

  test(
    'scheduler.dom-and-dow',
    "'0 9 1-7 * 1' with domAndDow runs on the first Monday only (node-cron's meaning); without it, on either day field",
    () =>
      withSchema(async (_schema, locks) => {
        // Real time, the clock set 0.7 s before 2027-01-01 09:00 (a Friday, day 1).
        const offset = Date.UTC(2027, 0, 1, 8, 59, 59, 300) - Date.now();
        const real = createScheduler(locks, { now: () => Date.now() + offset, retentionMs: 0 });
        const realTicks: string[] = [];
        real.register(
          'first-monday',
          '0 9 1-7 * 1',
          (run) => {
            realTicks.push(run.tick.toISOString());
          },
          { domAndDow: true },
        );
        await real.start();
        await sleep(1500);
        await real.stop();
        expect(realTicks, 'Friday the 1st is not a Monday').toEqual([]);

        // The whole of January 2027 on a simulated clock, both meanings.
        const clock = new SimulatedClock(Date.UTC(2026, 11, 31));
        const { scheduler, ran } = watched(locks, { clock, retentionMs: 0 });
        const ticks = { and: [] as string[], or: [] as string[] };
        scheduler.register(
          'and',
          '0 9 1-7 * 1',
          (run) => void ticks.and.push(run.tick.toISOString()),
          {
            domAndDow: true,
          },
        );
        scheduler.register(
          'or',
          '0 9 1-7 * 1',
          (run) => void ticks.or.push(run.tick.toISOString()),
        );
        await scheduler.start();
        for (let day = 1; day <= 31; day++) {
          const tick = Date.UTC(2027, 0, day, 9);
          await clock.advanceTo(tick);
          // Each run ends before the clock moves on: days pass here faster than catch-up's grace.
          if ([1, 2, 3, 4, 5, 6, 7, 11, 18, 25].includes(day)) await ran(tick, 'or');
          if (day === 4) await ran(tick, 'and');
        }
        await clock.advanceTo(Date.UTC(2027, 1, 1));
        await scheduler.stop();
        expect(ticks.and).toEqual(['2027-01-04T09:00:00.000Z']);
        expect(ticks.or.map((t) => t.slice(8, 10))).toEqual([
          '01',
          '02',
          '03',
          '04',
          '05',
          '06',
          '07',
          '11',
          '18',
          '25',
        ]);
      }),
    30_000,
  );

  test(
    'scheduler.run-info',
    'a handler learns its scheduled tick, how late it started, whether it is a catch-up, and its attempt',
    () =>
      withSchema(async (schema, locks) => {
        const tick = Date.UTC(2027, 2, 1);
        const clock = new SimulatedClock(tick - 500);
        // The ledger's latest row is 10 minutes old: ticks in between were missed.
        await fixture().observer.query(
          `INSERT INTO "${schema}".runs (job, tick, status, finished_at) VALUES ('minutely', $1, 'SUCCEEDED', now())`,
          [new Date(tick - 10 * 60_000).toISOString()],
        );
        const { scheduler, ran } = watched(locks, { clock, retentionMs: 0, catchUpGraceMs: 2000 });
        const seen: Omit<RunInfo, 'signal'>[] = [];
        scheduler.register(
          'minutely',
          '0 * * * * *',
          (run) => {
            seen.push({
              job: run.job,
              tick: run.tick,
              lateMs: run.lateMs,
              catchUp: run.catchUp,
              attempt: run.attempt,
            });
          },
          { catchUp: 'latest' },
        );
        await scheduler.start();
        await clock.advanceTo(tick);
        await ran(tick);
        await ran(tick - 60_000);
        await scheduler.stop();
        seen.sort((a, b) => b.tick.getTime() - a.tick.getTime());
        expect(seen).toEqual([
          { job: 'minutely', tick: new Date(tick), lateMs: 0, catchUp: false, attempt: 1 },
          {
            job: 'minutely',
            tick: new Date(tick - 60_000),
            lateMs: 60_000,
            catchUp: true,
            attempt: 1,
          },
        ]);
      }),
    30_000,
  );
}
