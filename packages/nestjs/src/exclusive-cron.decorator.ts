/**
 * `@ExclusiveCron(cron, { name })`: a method the lockkit scheduler runs once per tick across every
 * replica of the application.
 *
 * @packageDocumentation
 */
import 'reflect-metadata';
import type { JobOptions } from '@lockkit/core';
import { EXCLUSIVE_CRON_KEY } from './metadata-keys.js';

/**
 * Options of {@link ExclusiveCron}: the scheduler's job options (`mode`, `timezone`, `catchUp`,
 * `overlap`, `lease`, `retries`, `timeoutMs`, `jitterMs`, …, see `@lockkit/core`'s `JobOptions`)
 * plus the job's `name`.
 */
export interface ExclusiveCronOptions extends JobOptions {
  /**
   * The job's name: its ledger rows and lock are keyed by it, so every replica must use the same
   * name for the same job, and two jobs must never share one. Required — a name derived from the
   * class and method would silently start a new history when either is renamed.
   */
  readonly name: string;
}

/** What `@ExclusiveCron` records on a method. @internal */
export interface ExclusiveCronMetadata {
  readonly cron: string;
  readonly options: ExclusiveCronOptions;
}

/**
 * Registers the decorated method as a job of the lockkit scheduler: each tick of `cron` runs it
 * on exactly one replica, whatever their clocks say, even when one dies mid-run (the tick's row in
 * the ledger admits one run; a tick nobody ran is handled by `catchUp`). The method receives the
 * run: in transaction mode (default) a `TransactionRun` whose `run.tx` / `run.query` is the tick's
 * transaction — writes made through it commit together with the tick's ledger row; with
 * `mode: 'lease'` a `LeaseRun` for long jobs. The cron expression takes an optional seconds field
 * and is read in `timezone` (default UTC). Needs `LockkitScheduleModule` in the application; an
 * invalid expression or option, or a name used twice, makes the application's start fail with a
 * {@link LockkitModuleError}.
 *
 * @example
 * ```ts
 * @Injectable()
 * export class Billing {
 *   @ExclusiveCron('0 *\/5 * * * *', { name: 'issue-invoices' })
 *   async issue(run: TransactionRun<pg.PoolClient>) {
 *     await run.query('UPDATE invoices SET issued = true WHERE due <= now() AND NOT issued');
 *   }
 * }
 * ```
 */
export function ExclusiveCron(cron: string, options: ExclusiveCronOptions): MethodDecorator {
  const metadata: ExclusiveCronMetadata = { cron, options };
  return (_target, _key, descriptor) => {
    Reflect.defineMetadata(EXCLUSIVE_CRON_KEY, metadata, descriptor.value as object);
  };
}

/** The `@ExclusiveCron` metadata of a method, if it has any. @internal */
export function exclusiveCronOf(method: unknown): ExclusiveCronMetadata | undefined {
  if (typeof method !== 'function') return undefined;
  return Reflect.getMetadata(EXCLUSIVE_CRON_KEY, method) as ExclusiveCronMetadata | undefined;
}
