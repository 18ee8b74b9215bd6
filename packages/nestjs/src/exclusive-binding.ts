/**
 * What an `@Exclusive` method needs at call time and a decorator cannot know when the class is
 * defined: the application's lock client. The module attaches it to each provider instance that
 * has such methods while the application initialises.
 *
 * @packageDocumentation
 */
import 'reflect-metadata';
import type { LockClient } from '@lockkit/core';
import { EXCLUSIVE_BINDING_KEY } from './metadata-keys.js';

/** The lock client and reporting of one instance's `@Exclusive` methods. @internal */
export interface ExclusiveBinding {
  readonly locks: LockClient<unknown, unknown>;
  /** Lock namespace used when a method's options give none. */
  readonly namespace: string;
  /** Called when a replica skipped a call because another holds the lock. */
  readonly skipped: (name: string) => void;
}

/** Attaches `binding` to a provider instance. @internal */
export function bindExclusive(instance: object, binding: ExclusiveBinding): void {
  Reflect.defineMetadata(EXCLUSIVE_BINDING_KEY, binding, instance);
}

/** The binding of `instance`, if the module attached one. @internal */
export function exclusiveBindingOf(instance: unknown): ExclusiveBinding | undefined {
  if (typeof instance !== 'object' || instance === null) return undefined;
  return Reflect.getMetadata(EXCLUSIVE_BINDING_KEY, instance) as ExclusiveBinding | undefined;
}
