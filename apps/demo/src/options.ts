/**
 * Checks the command-line values that `pnpm demo` and `pnpm chaos` share.
 */
import { ADAPTERS, type AdapterName } from './adapters.js';

/** `--name`'s value as an integer from `min` to `max`, or an error saying so. */
export function integerOption(name: string, raw: string, min: number, max: number): number {
  const n = Number(raw);
  if (!Number.isInteger(n) || n < min || n > max)
    throw new Error(`--${name} must be an integer from ${min} to ${max}`);
  return n;
}

/** `--adapter`'s value, one of {@link ADAPTERS}, or an error listing them. */
export function adapterOption(raw: string): AdapterName {
  const adapter = raw as AdapterName;
  if (!ADAPTERS.includes(adapter))
    throw new Error(`--adapter must be one of ${ADAPTERS.join(', ')}`);
  return adapter;
}
