/**
 * `@lockkit/nestjs`: NestJS scheduled methods that run once per tick across every replica, on the
 * PostgreSQL you already run. `LockkitScheduleModule.forRoot({ lockKit })` plus
 * `@ExclusiveCron(expr, { name })` (the lockkit scheduler: ledger, catch-up, leases), or
 * `@Exclusive({ name })` on an existing `@Cron()` / `@Interval()` method (an advisory lock: never
 * at the same time).
 *
 * @packageDocumentation
 */
export { LockkitModuleError, type LockkitModuleErrorReason } from './errors.js';
export { lockEventLogger } from './event-logging.js';
export {
  Exclusive,
  type ExclusiveMethodDecorator,
  type ExclusiveOptions,
} from './exclusive.decorator.js';
export { ExclusiveCron, type ExclusiveCronOptions } from './exclusive-cron.decorator.js';
export { LockkitScheduleModule } from './lockkit-schedule.module.js';
export { LockkitScheduleService } from './lockkit-schedule.service.js';
export {
  LOCKKIT_SCHEDULE_OPTIONS,
  type LockkitScheduleModuleAsyncOptions,
  type LockkitScheduleModuleOptions,
} from './options.js';
