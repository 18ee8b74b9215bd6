#!/usr/bin/env node
/**
 * `pnpm test`: every package's tests through turbo, one package at a time, then one line over all
 * of them: `tests: N passed, N failed, N skipped` (the same code that .ci/run sums its passes
 * with). Flags after `--` go to turbo (pnpm keeps `--filter` for itself), and after a second `--`
 * to each package's vitest: `pnpm test -- --filter=@lockkit/pg -- -t leases`. (One package on
 * its own, without the line: `pnpm --filter @lockkit/pg test`.)
 *
 * Each package writes a JSON report into LOCKKIT_TEST_REPORT (see packages/test-db's
 * vitest-config.js): the folder given, else a temporary one removed at the end.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { formatCounts, readTestReports } from '../packages/test-db/src/test-report.js';
import { turbo } from './turbo.mjs';

const given = process.env.LOCKKIT_TEST_REPORT;
const folder = given ?? mkdtempSync(join(tmpdir(), 'lockkit-test-report-'));
process.env.LOCKKIT_TEST_REPORT = folder;
try {
  const args = process.argv.slice(2);
  const code = await turbo([
    'run',
    'test',
    '--concurrency=1',
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
