import { Cron } from 'croner';
import { describe, expect, it } from 'vitest';
import { MAX_TIMER_MS, SimulatedClock } from './clock.js';
import { TickTimer } from './tick-timer.js';

const cron = (pattern: string, timezone?: string) =>
  new Cron(pattern, { paused: true, ...(timezone && { timezone }) });

/** A timer on a simulated clock that records each fire as [tick, fired at]. */
function harness(
  pattern: string,
  start: number,
  options: { jitterMs?: number; random?: () => number; maxLateMs?: number } = {},
) {
  const clock = new SimulatedClock(start);
  const fired: [number, number][] = [];
  const timer = new TickTimer(cron(pattern), {
    clock,
    onTick: (tick) => fired.push([tick.getTime(), clock.now()]),
    ...options,
  });
  return { clock, fired, timer };
}

describe('TickTimer', () => {
  it('fires a yearly job exactly once per year over 10 years, never arming more than 2^31-1 ms', async () => {
    const { clock, fired, timer } = harness('0 0 0 1 1 *', Date.UTC(2026, 11, 1));
    timer.start();
    await clock.advanceTo(Date.UTC(2037, 0, 1) - 1);
    timer.stop();
    const years = Array.from({ length: 10 }, (_, i) => Date.UTC(2027 + i, 0, 1));
    expect(fired).toEqual(years.map((t) => [t, t]));
    expect(clock.pendingTimers).toBe(0);
  });

  it('fires a monthly job on the 1st of each month and not before', async () => {
    const { clock, fired, timer } = harness('0 0 0 1 * *', Date.UTC(2027, 0, 15));
    timer.start();
    await clock.advanceTo(Date.UTC(2027, 1, 1) - 1);
    expect(fired).toEqual([]);
    await clock.advanceTo(Date.UTC(2028, 0, 1));
    timer.stop();
    expect(fired.map(([t]) => new Date(t).toISOString().slice(0, 10))).toEqual([
      '2027-02-01',
      '2027-03-01',
      '2027-04-01',
      '2027-05-01',
      '2027-06-01',
      '2027-07-01',
      '2027-08-01',
      '2027-09-01',
      '2027-10-01',
      '2027-11-01',
      '2027-12-01',
      '2028-01-01',
    ]);
  });

  it('computes the next tick from the previous scheduled one: a jitter just under the gap drops none', async () => {
    // Alternate the largest and smallest jitter: each tick fires 999 ms late, then on time.
    let n = 0;
    const random = () => (n++ % 2 === 0 ? 0.999 : 0);
    const start = Date.UTC(2027, 0, 1);
    const { clock, fired, timer } = harness('* * * * * *', start, { jitterMs: 1000, random });
    timer.start();
    await clock.advanceTo(start + 1000 * 1000 + 999);
    timer.stop();
    expect(fired.map(([t]) => t)).toEqual(
      Array.from({ length: 1000 }, (_, i) => start + (i + 1) * 1000),
    );
    for (const [tick, at] of fired) {
      expect(at - tick).toBeGreaterThanOrEqual(0);
      expect(at - tick).toBeLessThan(1000);
    }
  });

  it('after a stall (the machine slept a day) fires the late ticks within maxLateMs once, then keeps time', async () => {
    const start = Date.UTC(2027, 0, 1);
    const clock = new SimulatedClock(start);
    const fired: number[] = [];
    const timer = new TickTimer(cron('0 * * * * *'), {
      clock,
      maxLateMs: 5 * 60_000,
      onTick: (tick) => fired.push(tick.getTime()),
    });
    timer.start();
    // The machine sleeps: the clock jumps a day while no timer can run.
    clock.jump(86_400_000);
    await clock.advanceTo(start + 86_400_000 + 120_000);
    timer.stop();
    const day = start + 86_400_000;
    // The first minute's timer finds itself a day late: dropped (catch-up's), then the
    // ticks of the last 5 minutes run late once each, then on time.
    expect(fired).toEqual(Array.from({ length: 7 }, (_, i) => day - 4 * 60_000 + i * 60_000));
  });

  it('stop() cancels the pending timer; start() again fires from the new now', async () => {
    const { clock, fired, timer } = harness('*/10 * * * * *', Date.UTC(2027, 0, 1));
    timer.start();
    await clock.advance(25_000);
    timer.stop();
    expect(clock.pendingTimers).toBe(0);
    await clock.advance(60_000);
    expect(fired.length).toBe(2);
    timer.start();
    await clock.advance(10_000);
    timer.stop();
    expect(fired.map(([t]) => t - Date.UTC(2027, 0, 1))).toEqual([10_000, 20_000, 90_000]);
  });

  it('never asks its clock for more than the step cap', async () => {
    const clock = new SimulatedClock(Date.UTC(2027, 0, 2));
    const asked: number[] = [];
    const spy = {
      now: () => clock.now(),
      setTimer: (ms: number, cb: () => void) => {
        asked.push(ms);
        return clock.setTimer(ms, cb);
      },
    };
    const timer = new TickTimer(cron('0 0 0 29 2 *', 'Europe/Oslo'), {
      clock: spy,
      onTick: () => {},
    });
    timer.start();
    await clock.advanceTo(Date.UTC(2033, 0, 1));
    timer.stop();
    expect(Math.max(...asked)).toBeLessThanOrEqual(MAX_TIMER_MS);
    expect(asked.length).toBeGreaterThan(80); // six years in steps of ~24.8 days
  });
});
