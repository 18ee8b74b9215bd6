/**
 * The levels `lockEventLogger` gives lock events, fed the events a lock client emits (built here
 * from a real key; which events a real lock operation emits is tested in test/module.test.ts).
 */
import { LockKey, type LockkitEvent } from '@lockkit/core';
import type { LoggerService } from '@nestjs/common';
import { expect, it } from 'vitest';
import { lockEventLogger } from './event-logging.js';

const key = LockKey.fromNames('nestjs', 'levels');
const base = { id: 1, key, scope: 'transaction', mode: 'exclusive' } as const;

function levelsOf(events: LockkitEvent[]): string[] {
  const levels: string[] = [];
  const logger: LoggerService = {
    log: () => levels.push('log'),
    error: () => levels.push('error'),
    warn: () => levels.push('warn'),
    verbose: () => levels.push('verbose'),
  };
  const listener = lockEventLogger(logger);
  for (const event of events) listener(event);
  return levels;
}

it('logs a lock lost under a running task at warn, a normal release at verbose', () => {
  expect(
    levelsOf([
      { ...base, type: 'lock-released', heldMs: 5, outcome: 'committed' },
      { ...base, type: 'lock-released', heldMs: 5, outcome: 'rolled-back' },
      { ...base, type: 'lock-released', heldMs: 5, outcome: 'lost' },
    ]),
  ).toEqual(['verbose', 'verbose', 'warn']);
});

it('logs failed and timed-out attempts and lost leases at warn', () => {
  expect(
    levelsOf([
      { ...base, type: 'lock-failed', waitedMs: 1, error: new Error('down') },
      { ...base, type: 'lock-timed-out', waitedMs: 1 },
      { type: 'lease-lost', namespace: 'n', jobKey: 'j', token: 1n, reason: 'expired' },
      { type: 'lease-renewed', namespace: 'n', jobKey: 'j', token: 1n },
    ]),
  ).toEqual(['warn', 'warn', 'warn', 'verbose']);
});
