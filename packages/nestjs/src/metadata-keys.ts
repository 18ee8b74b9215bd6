/**
 * The reflect-metadata keys this package writes. Plain strings, not module-local symbols, so that
 * a decorator imported through the ESM build and the module loaded through the CommonJS build
 * (two copies of this package's code in one process) still see each other's metadata.
 *
 * @packageDocumentation
 */

/** On a method: the {@link ExclusiveCronMetadata} of `@ExclusiveCron`. @internal */
export const EXCLUSIVE_CRON_KEY = 'lockkit:nestjs:exclusive-cron';

/** On a method: the {@link ExclusiveMetadata} of `@Exclusive`. @internal */
export const EXCLUSIVE_KEY = 'lockkit:nestjs:exclusive';

/** On a provider instance: the {@link ExclusiveBinding} its `@Exclusive` methods use. @internal */
export const EXCLUSIVE_BINDING_KEY = 'lockkit:nestjs:exclusive-binding';
