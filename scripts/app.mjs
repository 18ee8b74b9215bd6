#!/usr/bin/env node
/**
 * `pnpm demo`, `pnpm chaos`, `pnpm bench`: build the app and what it uses (saying so), then run
 * it with the flags given. Every root script takes its flags the same way — `pnpm bench --quick`,
 * `pnpm demo --seconds 5` — and the older form with `--` (`pnpm bench -- --scale --json`) still
 * works: pnpm passes that `--` on, and it is dropped here.
 *
 *   node scripts/app.mjs <workspace package> <entry, from the root> [flags…]
 */
import { resolve } from 'node:path';
import { buildWithProgress, root, run } from './turbo.mjs';

const [pkg, entry, ...rest] = process.argv.slice(2);
if (!pkg || !entry) {
  console.error('usage: node scripts/app.mjs <workspace package> <entry file> [flags…]');
  process.exit(2);
}
const flags = rest[0] === '--' ? rest.slice(1) : rest;

await buildWithProgress([pkg], `${pkg} and the packages it uses`);
process.exitCode = await run(process.execPath, [resolve(root, entry), ...flags]);
