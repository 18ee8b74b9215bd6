/**
 * The wake queue on a simulated clock: every sleeper woken once, at or after its time, earliest
 * first and equal times in the order queued, with one clock timer armed at most.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { SimulatedClock } from './clock.js';
import { type Sleeper, WakeQueue } from './wake-queue.js';

/** A sleeper that records when it was woken. */
function sleeper(clock: SimulatedClock, woken: [number, number][], id: number): Sleeper {
  return {
    wakeSlot: -1,
    wakeAt: Number.NaN,
    wakeSeq: 0,
    wake() {
      woken.push([id, clock.now()]);
    },
  };
}

describe('WakeQueue', () => {
  it('wakes each sleeper once, on time, in order of time then of queueing, on one clock timer', async () => {
    fc.assert(
      fc.asyncProperty(
        fc.array(fc.integer({ min: 0, max: 5_000 }), { minLength: 1, maxLength: 200 }),
        fc.array(fc.nat(), { maxLength: 40 }),
        async (delays, removals) => {
          const clock = new SimulatedClock(1_000_000);
          const queue = new WakeQueue(clock);
          const woken: [number, number][] = [];
          const sleepers = delays.map((_, id) => sleeper(clock, woken, id));
          delays.forEach((d, id) => {
            queue.add(sleepers[id] as Sleeper, 1_000_000 + d);
          });
          expect(clock.pendingTimers).toBe(1);
          const removed = new Set(removals.map((r) => r % delays.length));
          for (const id of removed) queue.remove(sleepers[id] as Sleeper);
          await clock.advanceTo(1_000_000 + 5_001);
          const expected = delays
            .map((d, id) => [id, 1_000_000 + d] as [number, number])
            .filter(([id]) => !removed.has(id))
            .sort((a, b) => a[1] - b[1] || a[0] - b[0]);
          expect(woken).toEqual(expected);
          expect(queue.size).toBe(0);
          expect(clock.pendingTimers).toBe(0);
        },
      ),
      { seed: 20261202, numRuns: 200 },
    );
  });

  it('queued again, a sleeper moves; woken, it may queue itself for later', async () => {
    const clock = new SimulatedClock(0);
    const queue = new WakeQueue(clock);
    const woken: [number, number][] = [];
    const a = sleeper(clock, woken, 1);
    let again = 2;
    const b: Sleeper = {
      ...sleeper(clock, woken, 2),
      wake() {
        woken.push([2, clock.now()]);
        if (again-- > 0) queue.add(b, clock.now() + 10);
      },
    };
    queue.add(a, 50);
    queue.add(b, 20);
    queue.add(a, 5); // moved earlier: woken once, at 5
    await clock.advanceTo(100);
    expect(woken).toEqual([
      [1, 5],
      [2, 20],
      [2, 30],
      [2, 40],
    ]);
    expect(clock.pendingTimers).toBe(0);
  });

  it('never arms a clock timer beyond what setTimeout takes: a far wake-up is reached in steps', async () => {
    const clock = new SimulatedClock(0);
    const queue = new WakeQueue(clock);
    const woken: [number, number][] = [];
    const far = 3 * 2_147_483_647;
    queue.add(sleeper(clock, woken, 1), far);
    await clock.advanceTo(far - 1);
    expect(woken).toEqual([]);
    await clock.advanceTo(far);
    expect(woken).toEqual([[1, far]]);
  });
});
