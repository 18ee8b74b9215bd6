#!/usr/bin/env node
/**
 * `pnpm demo`, `pnpm chaos`, `pnpm bench`: build the app and what it uses (saying so), then run
 * it with the flags given. Every root script takes its flags the same way — `pnpm bench --quick`,
 * `pnpm demo --seconds 5` — and the older form with `--` (`pnpm bench -- --scale --json`) still
 * works: pnpm passes that `--` on, and it is dropped here.
 *
 *   node scripts/app.mjs <workspace package> <entry, from the root> [flags…]
 *
 * LOCKKIT_APP_BUILT=1 skips the build: .ci/run builds everything once, then runs apps from several
 * lanes at a time, and turbo restores a cached build's outputs even when they are in place — one
 * lane's restore removed @lockkit/pg's dist under another lane's chaos run.
 */
import { resolve } from 'node:path';
import { buildWithProgress, root, run } from './turbo.mjs';

const [pkg, entry, ...rest] = process.argv.slice(2);
if (!pkg || !entry) {
  console.error('usage: node scripts/app.mjs <workspace package> <entry file> [flags…]');
  process.exit(2);
}
const flags = rest[0] === '--' ? rest.slice(1) : rest;

// biome-ignore lint/suspicious/noUndeclaredEnvVars: read by this script, which runs turbo; no turbo task reads it
if (process.env.LOCKKIT_APP_BUILT !== '1') {
  await buildWithProgress([pkg], `${pkg} and the packages it uses`);
}
process.exitCode = await run(process.execPath, [resolve(root, entry), ...flags]);
