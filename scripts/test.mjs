#!/usr/bin/env node
/**
 * `pnpm test`: every package's tests through turbo, then one line over all of them: `tests: N passed, N failed, N skipped` (the same code that .ci/run sums its passes
 * with). Flags after `--` go to turbo (pnpm keeps `--filter` for itself), and after a second `--`
 * to each package's vitest: `pnpm test -- --filter=@lockkit/pg -- -t leases`. (One package on
 * its own, without the line: `pnpm --filter @lockkit/pg test`.)
 *
 * Packages run one at a time when they share one server (DATABASE_URL): each suite counts the
 * server's locks and connections, and would see the others'. When each package starts a server of
 * its own (embedded, or a container), two run side by side: their tests mostly wait on the clock
 * and the server. LOCKKIT_TEST_CONCURRENCY=N overrides both (a whole number from 1).
 *
 * Each package writes a JSON report into LOCKKIT_TEST_REPORT (see packages/test-db's
 * vitest-config.js): the folder given, else a temporary one removed at the end.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { formatCounts, readTestReports } from '../packages/test-db/src/test-report.js';
import { turbo } from './turbo.mjs';

/** How many packages' tests run at once (see above). */
function concurrency(env) {
  const raw = env.LOCKKIT_TEST_CONCURRENCY;
  if (raw !== undefined && raw !== '') {
    const n = Number(raw);
    if (!Number.isInteger(n) || n < 1) {
      console.error(`LOCKKIT_TEST_CONCURRENCY must be a whole number from 1, got '${raw}'`);
      process.exit(2);
    }
    return n;
  }
  const source = env.LOCKKIT_TEST_DB;
  const sharedServer = source === 'env' || (source === undefined && Boolean(env.DATABASE_URL));
  return sharedServer ? 1 : 2;
}

const parallel = concurrency(process.env);
const given = process.env.LOCKKIT_TEST_REPORT;
const folder = given ?? mkdtempSync(join(tmpdir(), 'lockkit-test-report-'));
process.env.LOCKKIT_TEST_REPORT = folder;
try {
  const args = process.argv.slice(2);
  const code = await turbo([
    'run',
    'test',
    `--concurrency=${parallel}`,
    // Side by side, each package's output still reads as one block.
    ...(parallel > 1 ? ['--log-order=grouped'] : []),
    ...(args[0] === '--' ? args.slice(1) : args),
  ]);
  const totals = readTestReports(folder);
  const red = totals.reports.filter((r) => r.failed > 0).map((r) => r.name);
  const line = totals.reports.length === 0 ? 'no test results found' : formatCounts(totals);
  const note =
    red.length > 0
      ? ` (failures in ${red.join(', ')})`
      : code !== 0
        ? ' (the run failed before every package reported: see above)'
        : '';
  console.log(`tests: ${line}${note}`);
  process.exitCode = code !== 0 ? code : totals.failed > 0 ? 1 : 0;
} finally {
  if (!given) rmSync(folder, { recursive: true, force: true });
}
