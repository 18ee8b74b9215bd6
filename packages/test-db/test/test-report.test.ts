/**
 * The one "N passed, N failed, N skipped" line that `pnpm test` and .ci/run end with, added up from
 * the JSON reports vitest writes under LOCKKIT_TEST_REPORT.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterEach, describe, expect, it } from 'vitest';
import { formatCounts, readTestReports } from '../src/test-report.js';

const cli = fileURLToPath(new URL('../src/test-report.js', import.meta.url));
const folders: string[] = [];
afterEach(() => {
  for (const f of folders.splice(0)) rmSync(f, { recursive: true, force: true });
});

/** A vitest JSON report as its `json` reporter writes it (only the fields that matter here). */
function report(
  tests: ('passed' | 'failed' | 'skipped' | 'todo')[][],
  extra: { loadError?: boolean; success?: boolean } = {},
) {
  const all = tests.flat();
  const files = tests.map((statuses, i) => ({
    name: `/repo/test/file-${i}.test.ts`,
    status: statuses.includes('failed') ? 'failed' : 'passed',
    message: '',
    assertionResults: statuses.map((status) => ({ status })),
  }));
  if (extra.loadError)
    files.push({
      name: '/repo/test/broken.test.ts',
      status: 'failed',
      message: "Cannot find module './gone.js'",
      assertionResults: [],
    });
  const failedTests = all.filter((s) => s === 'failed').length;
  return {
    numTotalTests: all.length,
    numPassedTests: all.filter((s) => s === 'passed').length,
    numFailedTests: failedTests,
    numPendingTests: all.filter((s) => s === 'skipped').length,
    numTodoTests: all.filter((s) => s === 'todo').length,
    numFailedTestSuites: files.filter((f) => f.status === 'failed').length,
    success: extra.success ?? (failedTests === 0 && !extra.loadError),
    testResults: files,
  };
}

function folderWith(files: Record<string, unknown>): string {
  const root = mkdtempSync(join(tmpdir(), 'lockkit-test-report-'));
  folders.push(root);
  for (const [name, content] of Object.entries(files)) {
    mkdirSync(join(root, name, '..'), { recursive: true });
    writeFileSync(join(root, name), JSON.stringify(content));
  }
  return root;
}

describe('readTestReports', () => {
  it('adds up every package report, in nested folders too (one per CI pass)', () => {
    const root = folderWith({
      'env/core.json': report([
        ['passed', 'passed', 'skipped'],
        ['passed', 'todo'],
      ]),
      'env/pg.json': report([['passed', 'failed']]),
      'node22/core.json': report([['passed']]),
    });
    const r = readTestReports(root);
    expect(r).toMatchObject({ passed: 5, failed: 1, skipped: 2 });
    expect(r.reports.map((x) => [x.name, formatCounts(x)])).toEqual([
      ['env/core', '3 passed, 0 failed, 2 skipped'],
      ['env/pg', '1 passed, 1 failed, 0 skipped'],
      ['node22/core', '1 passed, 0 failed, 0 skipped'],
    ]);
  });

  it('counts known defects run as it.fails apart: never among the passes', () => {
    const r0 = report([['passed', 'passed', 'passed']]);
    // The third ran as `it.fails` and failed as expected: vitest counts it passed.
    const results = r0.testResults[0]?.assertionResults as { status: string; meta?: object }[];
    (results[2] as { meta?: object }).meta = { expectedFailure: true };
    const r = readTestReports(folderWith({ 'env/postgres.json': r0 }));
    expect(r).toMatchObject({ passed: 2, failed: 0, skipped: 0, expectedFailures: 1 });
    expect(formatCounts(r)).toBe(
      '2 passed, 0 failed, 0 skipped, 1 expected failures (known defects, it.fails)',
    );
  });

  it('counts a test file that failed outside any test (an import error) as a failure', () => {
    const r = readTestReports(
      folderWith({ 'cli.json': report([['passed']], { loadError: true }) }),
    );
    expect(formatCounts(r)).toBe('1 passed, 1 failed, 0 skipped');
  });

  it('counts a run that failed with every test green (an unhandled error) as a failure', () => {
    const r = readTestReports(
      folderWith({ 'otel.json': report([['passed']], { success: false }) }),
    );
    expect(formatCounts(r)).toBe('1 passed, 1 failed, 0 skipped');
  });

  it('follows no symbolic link (CI keeps a folder of links to /usr/bin beside the reports)', () => {
    const root = folderWith({ 'env/core.json': report([['passed']]) });
    symlinkSync(root, join(root, 'loop'));
    symlinkSync(join(root, 'env/core.json'), join(root, 'linked.json'));
    const r = readTestReports(root);
    expect(r.reports.map((x) => x.name)).toEqual(['env/core']);
  });

  it('reads an empty or missing folder as no reports', () => {
    expect(readTestReports(folderWith({}))).toMatchObject({ reports: [], passed: 0 });
    expect(readTestReports(join(tmpdir(), 'lockkit-no-such-folder'))).toMatchObject({
      reports: [],
    });
  });
});

describe('node test-report.js <folder> (what .ci/run calls)', () => {
  it('prints a line per report and ends with the one summary line; exit 0 when all passed', () => {
    const root = folderWith({ 'core.json': report([['passed', 'skipped']]) });
    const out = execFileSync(process.execPath, [cli, root], { encoding: 'utf8' });
    expect(out.trim().split('\n')).toEqual([
      'core: 1 passed, 0 failed, 1 skipped',
      'tests: 1 passed, 0 failed, 1 skipped',
    ]);
  });

  it('exits 1 on a failure, and when there is nothing to count', () => {
    const failing = spawnSync(
      process.execPath,
      [cli, folderWith({ 'pg.json': report([['failed']]) })],
      { encoding: 'utf8' },
    );
    expect(failing.status).toBe(1);
    expect(failing.stdout.trim().split('\n').at(-1)).toBe('tests: 0 passed, 1 failed, 0 skipped');
    const empty = spawnSync(process.execPath, [cli, folderWith({})], { encoding: 'utf8' });
    expect(empty.status).toBe(1);
    expect(empty.stdout.trim()).toBe('tests: no test results found');
  });
});
