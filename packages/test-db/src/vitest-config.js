// The vitest settings every package with real-Postgres tests shares, so that a package's
// `vitest.config.ts` is two lines. Plain JavaScript: vitest loads config files with Node itself,
// which cannot import TypeScript from a workspace package. Types: vitest-config.d.ts.
import { basename } from 'node:path';
import { fileURLToPath } from 'node:url';

/**
 * With LOCKKIT_TEST_REPORT set to a folder, each package also writes a JSON report there, which
 * .ci/run adds up into one "N passed, N failed" line.
 */
function reporters() {
  const folder = process.env.LOCKKIT_TEST_REPORT;
  if (!folder) return {};
  return {
    reporters: ['default', 'json'],
    outputFile: { json: `${folder}/${basename(process.cwd())}.json` },
  };
}

/** @type {import('./vitest-config.d.ts').lockkitTestConfig} */
export function lockkitTestConfig(overrides = {}, options = {}) {
  // The global setup runs in this process: tell it whether this package wants a PgBouncer.
  if (options.pgbouncer) process.env.LOCKKIT_TEST_WANTS_PGBOUNCER = '1';
  return {
    test: {
      globalSetup: [fileURLToPath(new URL('./global-setup.ts', import.meta.url))],
      setupFiles: [fileURLToPath(new URL('./setup.ts', import.meta.url))],
      testTimeout: 30_000,
      hookTimeout: 60_000,
      ...reporters(),
      ...overrides,
    },
  };
}
