/** Test counts of one package's report, or of all of them. */
export interface TestCounts {
  readonly passed: number;
  /** Failed tests, plus test files (or whole runs) that failed outside any test. */
  readonly failed: number;
  /** Skipped and todo tests. */
  readonly skipped: number;
  /**
   * Known defects run as `it.fails` (marked `meta.expectedFailure`) that failed as expected: not
   * in `passed`. Absent in counts made by hand means none.
   */
  readonly expectedFailures?: number;
}

/** One vitest JSON report, named by its path under the folder without `.json` (`env/core`). */
export interface TestReport extends TestCounts {
  readonly name: string;
}

/** Reads every vitest JSON report under `folder` (nested folders too) and adds them up. */
export declare function readTestReports(
  folder: string,
): TestCounts & { readonly reports: readonly TestReport[] };

/** `N passed, N failed, N skipped`, and `, N expected failures (…)` when there are any. */
export declare function formatCounts(counts: TestCounts): string;
