import { getEventListeners } from 'node:events';
import { describe, expect, it } from 'vitest';
import { whenAborted } from './abort-listeners.js';

describe('whenAborted()', () => {
  it('keeps one listener on a signal for any number of callbacks, and calls them in order', () => {
    const controller = new AbortController();
    const calls: number[] = [];
    for (let i = 0; i < 1000; i++) whenAborted(controller.signal, () => calls.push(i));
    expect(getEventListeners(controller.signal, 'abort')).toHaveLength(1);
    controller.abort();
    expect(calls).toEqual(Array.from({ length: 1000 }, (_, i) => i));
  });

  it('calls nothing that was forgotten, and calls each callback once', () => {
    const controller = new AbortController();
    const calls: string[] = [];
    const forgetA = whenAborted(controller.signal, () => calls.push('a'));
    whenAborted(controller.signal, () => calls.push('b'));
    forgetA();
    forgetA();
    controller.abort();
    controller.abort();
    expect(calls).toEqual(['b']);
  });

  it('calls at once, synchronously, for a signal already aborted, and adds no listener', () => {
    const signal = AbortSignal.abort();
    const calls: string[] = [];
    const forget = whenAborted(signal, () => calls.push('now'));
    expect(calls).toEqual(['now']);
    expect(getEventListeners(signal, 'abort')).toHaveLength(0);
    forget();
  });

  it('a callback that throws keeps none of the others from running, and its error is not lost', async () => {
    const controller = new AbortController();
    const calls: string[] = [];
    const thrown: unknown[] = [];
    const onUncaught = (error: unknown) => thrown.push(error);
    const listeners = process.listeners('uncaughtException');
    process.removeAllListeners('uncaughtException');
    process.on('uncaughtException', onUncaught);
    try {
      whenAborted(controller.signal, () => {
        throw new Error('boom');
      });
      whenAborted(controller.signal, () => calls.push('after'));
      controller.abort();
      expect(calls).toEqual(['after']);
      await new Promise((r) => setImmediate(r));
      expect(thrown).toEqual([new Error('boom')]);
    } finally {
      process.off('uncaughtException', onUncaught);
      for (const l of listeners) process.on('uncaughtException', l);
    }
  });

  it('a signal whose callbacks were all forgotten gets new ones on the same listener', () => {
    const controller = new AbortController();
    const calls: string[] = [];
    whenAborted(controller.signal, () => calls.push('a'))();
    whenAborted(controller.signal, () => calls.push('b'));
    expect(getEventListeners(controller.signal, 'abort')).toHaveLength(1);
    controller.abort();
    expect(calls).toEqual(['b']);
  });
});
