/**
 * Where the decorators record what they declare: on the class's prototype, listed by property
 * key. Recording on the class instead of on the method function keeps a declaration visible when
 * the method is later replaced — re-bound in the constructor, or wrapped by another decorator
 * applied after ours — and lets one method carry two declarations.
 *
 * @packageDocumentation
 */
import 'reflect-metadata';
import { LockkitModuleError } from './errors.js';

/** One declaration of a decorator on one method. @internal */
export interface MethodDeclaration<T> {
  /** The method's property key (a string or a symbol). */
  readonly key: string | symbol;
  /** The method as the decorator saw it. */
  readonly method: (...args: unknown[]) => unknown;
  /** What the decorator recorded. */
  readonly value: T;
}

/**
 * Checks that a decorator named `decorator` was put on an instance method and returns it; a static
 * method, an accessor or a field is refused with a {@link LockkitModuleError} when the class is
 * defined. @internal
 */
export function instanceMethod(
  decorator: string,
  target: object,
  key: string | symbol,
  descriptor: PropertyDescriptor | undefined,
): (...args: unknown[]) => unknown {
  if (typeof target === 'function') {
    throw new LockkitModuleError(
      'OPTIONS_INVALID',
      `${decorator} decorates instance methods; ${target.name}.${String(key)} is static, and Nest runs only the methods of the provider instances it creates.`,
    );
  }
  const method: unknown = descriptor?.value;
  if (typeof method !== 'function') {
    throw new LockkitModuleError(
      'OPTIONS_INVALID',
      `${decorator} decorates methods only; ${String(key)} is ${descriptor?.get || descriptor?.set ? 'an accessor' : 'not a method'}.`,
    );
  }
  return method as (...args: unknown[]) => unknown;
}

/** Adds `declaration` to the list `metadataKey` of the class whose prototype is `prototype`. @internal */
export function declare<T>(
  metadataKey: string,
  prototype: object,
  declaration: MethodDeclaration<T>,
): void {
  const own = (Reflect.getOwnMetadata(metadataKey, prototype) ?? []) as MethodDeclaration<T>[];
  Reflect.defineMetadata(metadataKey, [...own, declaration], prototype);
}

/**
 * Every declaration `metadataKey` on the classes of `instance` and their base classes; a key
 * declared by a subclass hides its base classes' declarations of that key. @internal
 */
export function declarationsOf<T>(metadataKey: string, instance: object): MethodDeclaration<T>[] {
  const found: MethodDeclaration<T>[] = [];
  const hidden = new Set<string | symbol>();
  for (
    let prototype: object | null = Object.getPrototypeOf(instance) as object | null;
    prototype !== null && prototype !== Object.prototype;
    prototype = Object.getPrototypeOf(prototype) as object | null
  ) {
    const own = (Reflect.getOwnMetadata(metadataKey, prototype) ?? []) as MethodDeclaration<T>[];
    const keys = new Set<string | symbol>();
    for (const declaration of own) {
      if (hidden.has(declaration.key)) continue;
      keys.add(declaration.key);
      found.push(declaration);
    }
    for (const key of keys) hidden.add(key);
  }
  return found;
}
