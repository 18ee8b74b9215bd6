import { describe, expect, it } from 'vitest';
import { ConnectionFate } from './connection-fate.js';

describe('ConnectionFate', () => {
  it('starts alive, with a signal that has not fired', () => {
    const fate = new ConnectionFate();
    expect(fate.aborted).toBe(false);
    expect(fate.reason).toBeUndefined();
    expect(fate.signal.aborted).toBe(false);
  });

  it('fires a signal read before the death, with the reason', () => {
    const fate = new ConnectionFate();
    const { signal } = fate;
    const heard: unknown[] = [];
    signal.addEventListener('abort', () => heard.push(signal.reason));
    const reason = new Error('Connection ended');
    fate.abort(reason);
    expect(signal.aborted).toBe(true);
    expect(heard).toEqual([reason]);
    expect(fate.signal).toBe(signal);
  });

  it('hands out an already-aborted signal when first read after the death', () => {
    const fate = new ConnectionFate();
    const reason = new Error('terminated');
    fate.abort(reason);
    expect(fate.aborted).toBe(true);
    expect(fate.signal.aborted).toBe(true);
    expect(fate.signal.reason).toBe(reason);
  });

  it('keeps the first reason reported', () => {
    const fate = new ConnectionFate();
    const first = new Error('first');
    fate.abort(first);
    fate.abort(new Error('second'));
    expect(fate.reason).toBe(first);
    expect(fate.signal.reason).toBe(first);
  });
});
