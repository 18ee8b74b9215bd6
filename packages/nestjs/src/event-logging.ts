/**
 * The scheduler's outcomes as lines of a Nest logger, at levels an operator expects: failures and
 * infrastructure errors at `error`, ticks nobody ran and overlaps at `warn`, runs at `debug`,
 * and the normal "another replica has it" at `verbose`.
 *
 * @packageDocumentation
 */
import type { LockkitEvent, Scheduler } from '@lockkit/core';
import type { LoggerService } from '@nestjs/common';

const at = (tick: Date) => tick.toISOString();

const stackOf = (error: unknown): string | undefined =>
  error instanceof Error ? error.stack : undefined;

const describe = (error: unknown): string =>
  error instanceof Error ? `${error.name}: ${error.message}` : String(error);

/** Logs every outcome of `scheduler` through `logger`. @internal */
export function logSchedulerEvents(scheduler: Scheduler<unknown>, logger: LoggerService): void {
  scheduler.on('ran', (e) =>
    logger.debug?.(
      `${e.job} @ ${at(e.tick)} ran in ${Math.round(e.durationMs)} ms (attempt ${e.attempt})`,
    ),
  );
  scheduler.on('failed', (e) =>
    logger.error(
      `${e.job} @ ${at(e.tick)} failed (attempt ${e.attempt}${e.willRetry ? ', will retry' : ''}): ${describe(e.error)}`,
      stackOf(e.error),
    ),
  );
  scheduler.on('skipped-done', (e) =>
    logger.verbose?.(`${e.job} @ ${at(e.tick)}: another replica has this tick`),
  );
  scheduler.on('skipped-held', (e) =>
    logger.warn(`${e.job} @ ${at(e.tick)} skipped: a run of an earlier tick still holds the job`),
  );
  scheduler.on('queue-full', (e) =>
    logger.warn(`${e.job} @ ${at(e.tick)} skipped: its queue of waiting ticks is full`),
  );
  scheduler.on('missed', (e) =>
    logger.warn(
      `${e.job}: ${e.ticks.length} tick(s) nobody ran, recorded missed (${e.ticks.map(at).join(', ')})`,
    ),
  );
  scheduler.on('lease-lost', (e) =>
    logger.error(`${e.job} @ ${at(e.tick)} lost its lease: ${e.error.message}`, stackOf(e.error)),
  );
  scheduler.on('error', (e) =>
    logger.error(`${e.job} @ ${at(e.tick)}: ${describe(e.error)}`, stackOf(e.error)),
  );
  scheduler.on('schedule-conflict', (e) =>
    logger.warn(
      `${e.job} is registered under different schedules: ${e.schedules
        .map((r) => `${r.owner} runs "${r.cron}" (${r.timezone})`)
        .join(', ')}`,
    ),
  );
}

/**
 * A lock client `onEvent` listener that logs lock and lease events through a Nest logger: lost
 * leases, locks lost under a running task and failed lock attempts at `warn`, the rest at
 * `verbose`. Pass it when you create the lock client, to see the locks under `@Exclusive` methods
 * and lease renewals.
 *
 * @example
 * ```ts
 * const lockKit = createLockKit(pool, { onEvent: lockEventLogger(new Logger('Lockkit')) });
 * ```
 */
export function lockEventLogger(logger: LoggerService): (event: LockkitEvent) => void {
  return (event) => {
    switch (event.type) {
      case 'lock-failed':
        logger.warn(`lock ${event.key} failed: ${describe(event.error)}`);
        return;
      case 'lock-timed-out':
        logger.warn(`lock ${event.key} timed out after ${Math.round(event.waitedMs)} ms`);
        return;
      case 'lease-lost':
        logger.warn(`lease ${event.namespace}/${event.jobKey} lost: ${event.reason}`);
        return;
      case 'lock-released':
        if (event.outcome === 'lost') {
          logger.warn(`lock ${event.key} lost: its connection or transaction died under the task`);
          return;
        }
        logger.verbose?.(`${event.type} ${event.key} (${event.scope})`);
        return;
      case 'lock-attempt':
      case 'lock-acquired':
      case 'lock-skipped':
        logger.verbose?.(`${event.type} ${event.key} (${event.scope})`);
        return;
      default:
        logger.verbose?.(`${event.type} ${event.namespace}/${event.jobKey} token ${event.token}`);
    }
  };
}
