import { describe, expect, it } from 'vitest';
import { MAX_TIMER_MS, SimulatedClock, systemClock } from './clock.js';

describe('SimulatedClock', () => {
  it('runs timers in due order, each at its own time, and only when advanced', async () => {
    const clock = new SimulatedClock(1000);
    const fired: [string, number][] = [];
    clock.setTimer(300, () => fired.push(['b', clock.now()]));
    clock.setTimer(100, () => fired.push(['a', clock.now()]));
    clock.setTimer(300, () => fired.push(['c', clock.now()]));
    const cancelled = clock.setTimer(200, () => fired.push(['x', clock.now()]));
    cancelled.cancel();
    expect(clock.pendingTimers).toBe(3);
    await clock.advance(99);
    expect(fired).toEqual([]);
    await clock.advanceTo(new Date(1300));
    expect(fired).toEqual([
      ['a', 1100],
      ['b', 1300],
      ['c', 1300],
    ]);
    expect(clock.now()).toBe(1300);
    expect(clock.nextTimerAt()).toBeUndefined();
  });

  it('runs a timer armed after an await inside an earlier one, in the same advance', async () => {
    const clock = new SimulatedClock(0);
    const fired: number[] = [];
    clock.setTimer(10, async () => {
      await Promise.resolve();
      clock.setTimer(10, () => fired.push(clock.now()));
    });
    await clock.advanceTo(100);
    expect(fired).toEqual([20]);
  });

  it('refuses a delay setTimeout would overflow, and a non-finite start', () => {
    const clock = new SimulatedClock(0);
    expect(() => clock.setTimer(MAX_TIMER_MS + 1, () => {})).toThrow(
      expect.objectContaining({ code: 'OPTION_INVALID' }),
    );
    expect(() => new SimulatedClock(Number.NaN)).toThrow(
      expect.objectContaining({ code: 'OPTION_INVALID' }),
    );
  });
});

describe('systemClock', () => {
  it('clamps a delay above 2^31-1 ms instead of letting setTimeout fire it at once', async () => {
    let fired = false;
    const timer = systemClock.setTimer(MAX_TIMER_MS * 2, () => {
      fired = true;
    });
    await new Promise((r) => setTimeout(r, 20));
    timer.cancel();
    expect(fired).toBe(false);
  });
});
