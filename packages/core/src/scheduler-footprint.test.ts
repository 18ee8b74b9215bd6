/**
 * What a scheduler holds per job, in counts rather than bytes: its jobs wait on one clock timer
 * between them, however many there are (a Node `Timeout` and a closure each cost ~250 bytes a
 * job), and the docs' memory figures (docs/performance.md) come from `pnpm bench --memory`.
 */
import { queryObjects, setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { describe, expect, it } from 'vitest';
import { SimulatedClock } from './clock.js';
import { CronMask } from './cron-mask.js';
import { CronSchedule, cronerParseCount, heldParseCount, RECENT_PARSES } from './cron-schedule.js';
import type { LockClient } from './lock.js';
import { createScheduler } from './scheduler.js';

/** Start announces the jobs to the ledger; with no database that fails, which start tolerates. */
const locks = {
  schema: 'lockkit_unused',
  executor: { transaction: () => Promise.reject(new Error('no database in this test')) },
} as unknown as LockClient<unknown, unknown>;

describe('scheduler footprint', () => {
  it('the jobs of a scheduler, on one schedule or on many, wait on one clock timer', async () => {
    const clock = new SimulatedClock(Date.UTC(2027, 0, 1, 12));
    const scheduler = createScheduler(locks, { clock });
    for (let j = 0; j < 500; j++) {
      const cron = j % 2 === 0 ? '0 0 * * * *' : `${j % 60} ${Math.floor(j / 60)} 3 * * *`;
      scheduler.register(`job-${j}`, cron, () => {});
    }
    await scheduler.start();
    expect(clock.pendingTimers).toBe(1);
    await scheduler.stop({ timeoutMs: 100 });
    expect(clock.pendingTimers).toBe(0);
  });

  it('jobs on one schedule without jitter, started together, share one tick timer and all fire', async () => {
    const clock = new SimulatedClock(Date.UTC(2027, 0, 1, 12, 0, 30));
    const scheduler = createScheduler(locks, { clock });
    for (let j = 0; j < 300; j++) scheduler.register(`hourly-${j}`, '0 0 * * * *', () => {});
    scheduler.register('jittered', '0 0 * * * *', () => {}, { jitterMs: 400 });
    scheduler.register('own-schedule', '0 30 * * * *', () => {});
    const erred = new Set<string>();
    scheduler.on('error', (event) => {
      if (event.job !== undefined) erred.add(event.job);
    });
    await scheduler.start();
    // One timer for the 300, one for the jittered job, one for the other schedule.
    expect((scheduler as unknown as { timers: { size: number } }).timers.size).toBe(3);
    // Each tick is each job's own: with no database, each job reports its own failed tick.
    await clock.advanceTo(Date.UTC(2027, 0, 1, 13, 0, 5));
    await new Promise((r) => setTimeout(r, 50));
    expect(erred.size).toBe(302);
    await scheduler.stop({ timeoutMs: 100 });
  });

  it('1,000 distinct UTC schedules are registered, started and timed without a croner parse', async () => {
    // croner allocates an ~80 KB year table at every parse: 10,000 distinct schedules made 800 MB
    // of garbage at registration, which grew V8's young generation (docs/performance.md).
    const clock = new SimulatedClock(Date.UTC(2027, 0, 1, 12));
    const scheduler = createScheduler(locks, { clock });
    const before = cronerParseCount();
    for (let j = 0; j < 1000; j++)
      scheduler.register(`plain-${j}`, `${j % 60} ${Math.floor(j / 60)} 4 * * *`, () => {});
    await scheduler.start();
    await clock.advanceTo(Date.UTC(2027, 0, 1, 23));
    expect(cronerParseCount()).toBe(before);
    await scheduler.stop({ timeoutMs: 100 });
  });

  it("distinct schedules hold no croner parse once registered, and at most the recent ones' later", async () => {
    const clock = new SimulatedClock(Date.UTC(2027, 0, 1, 12));
    const scheduler = createScheduler(locks, { clock });
    for (let j = 0; j < 3 * RECENT_PARSES; j++)
      scheduler.register(`distinct-${j}`, `${j % 60} ${Math.floor(j / 60)} 4 * * *`, () => {});
    // Each parse answered its registration's one question and was let go.
    expect(heldParseCount()).toBe(0);
    await scheduler.start();
    // Started at the instant they were registered at: every first tick is the one remembered.
    expect(heldParseCount()).toBe(0);
    await clock.advanceTo(Date.UTC(2027, 0, 2, 4, 15));
    expect(heldParseCount()).toBeLessThanOrEqual(RECENT_PARSES);
    await scheduler.stop({ timeoutMs: 100 });
  });

  it('distinct schedules and their jobs are rows of tables, not objects each', async () => {
    // What a scheduler keeps, it first allocates in V8's young generation and copies out of it:
    // an object per schedule or per job counted twice towards growing the young generation, whose
    // semi-spaces made most of the peak resident set with 10,000 distinct schedules
    // (docs/performance.md). Live objects are counted here, each kind against a bound that does
    // not grow with the jobs: the recent views and parses (RECENT_PARSES) at most.
    const clock = new SimulatedClock(Date.UTC(2027, 0, 1, 12));
    const scheduler = createScheduler(locks, { clock });
    const jobs = 3 * RECENT_PARSES;
    for (let j = 0; j < jobs; j++)
      scheduler.register(`row-${j}`, `${j % 60} ${Math.floor(j / 60)} 4 * * *`, () => {});
    await scheduler.start();
    // A full GC first, so that only what is held is counted (vitest runs without --expose-gc).
    setFlagsFromString('--expose-gc');
    const gc = runInNewContext('gc') as () => void;
    const count = (ctor: { prototype: object }): number => {
      gc();
      return queryObjects(ctor as never, { format: 'count' }) as number;
    };
    expect(count(CronMask)).toBeLessThanOrEqual(RECENT_PARSES);
    expect(count(CronSchedule)).toBeLessThanOrEqual(RECENT_PARSES);
    // Every object held (all have Object.prototype in their chain), before and after as many
    // jobs again on distinct schedules, registered after start() (each then timed at once), all
    // with one handler: the names are strings, so what grows is what the scheduler keeps.
    const handler = () => {};
    const before = count(Object);
    for (let j = jobs; j < 2 * jobs; j++)
      scheduler.register(`row-${j}`, `${j % 60} ${Math.floor(j / 60) % 60} 5 * * *`, handler);
    // Each registration after start() announces its job (refused here): let those settle.
    await new Promise((r) => setTimeout(r, 20));
    expect(count(Object) - before).toBeLessThan(jobs / 8);
    await scheduler.stop({ timeoutMs: 100 });
  });
});
