// Adds up the JSON reports that vitest writes when LOCKKIT_TEST_REPORT names a folder (see
// vitest-config.js) into one "N passed, N failed, N skipped" line (", N expected failures" after it
// when known defects ran as `it.fails`). `pnpm test` ends with it
// (scripts/test.mjs) and so does .ci/run, over all its passes: one piece of code for both.
// Plain JavaScript, so that `node` runs it without a build. Types: test-report.d.ts.
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

/**
 * Every `*.json` file under `folder`, in nested folders too, sorted by path. Symbolic links are
 * not followed: a report is a file vitest wrote there.
 */
function reportFiles(folder) {
  if (!existsSync(folder)) return [];
  const found = [];
  const entries = readdirSync(folder, { withFileTypes: true });
  for (const entry of entries.sort((a, b) => a.name.localeCompare(b.name))) {
    const path = join(folder, entry.name);
    if (entry.isDirectory()) found.push(...reportFiles(path));
    else if (entry.isFile() && entry.name.endsWith('.json')) found.push(path);
  }
  return found;
}

/**
 * Counts one vitest JSON report. A test file that failed outside any test (an import error, a
 * failing `afterAll`) counts as one failure, and so does a run that failed with every test green
 * (an unhandled error): the line must never say "0 failed" for a red run.
 */
function count(report) {
  const files = report.testResults ?? [];
  const loadFailures = files.filter(
    (file) =>
      file.status === 'failed' && !(file.assertionResults ?? []).some((t) => t.status === 'failed'),
  ).length;
  let failed = report.numFailedTests + loadFailures;
  if (report.success === false && failed === 0) failed = 1;
  // A known defect run as `it.fails` passes when it fails: vitest counts it passed. The
  // conformance suite marks it (meta.expectedFailure), and it is counted apart, never as a pass.
  const expectedFailures = files
    .flatMap((file) => file.assertionResults ?? [])
    .filter((t) => t.status === 'passed' && t.meta?.expectedFailure === true).length;
  return {
    passed: report.numPassedTests - expectedFailures,
    failed,
    skipped: report.numPendingTests + report.numTodoTests,
    expectedFailures,
  };
}

/** @type {import('./test-report.d.ts').readTestReports} */
export function readTestReports(folder) {
  const reports = reportFiles(folder).map((file) => ({
    name: relative(folder, file).replace(/\.json$/, ''),
    ...count(JSON.parse(readFileSync(file, 'utf8'))),
  }));
  const sum = (key) => reports.reduce((total, r) => total + r[key], 0);
  return {
    reports,
    passed: sum('passed'),
    failed: sum('failed'),
    skipped: sum('skipped'),
    expectedFailures: sum('expectedFailures'),
  };
}

/** @type {import('./test-report.d.ts').formatCounts} */
export function formatCounts(counts) {
  const known = counts.expectedFailures
    ? `, ${counts.expectedFailures} expected failures (known defects, it.fails)`
    : '';
  return `${counts.passed} passed, ${counts.failed} failed, ${counts.skipped} skipped${known}`;
}

// `node test-report.js <folder>`: a line per report, then the total; exit 1 on any failure or
// when nothing was counted.
if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  const totals = readTestReports(process.argv[2] ?? '.');
  for (const r of totals.reports) console.log(`${r.name}: ${formatCounts(r)}`);
  if (totals.passed === 0 && totals.failed === 0 && !totals.expectedFailures) {
    console.log('tests: no test results found');
    process.exit(1);
  }
  console.log(`tests: ${formatCounts(totals)}`);
  process.exit(totals.failed > 0 ? 1 : 0);
}
