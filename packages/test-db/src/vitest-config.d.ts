import type { ViteUserConfig } from 'vitest/config';

/** Vitest config with the test-database global setup and the per-test lock-leak check. */
export declare function lockkitTestConfig(
  overrides?: ViteUserConfig['test'],
  options?: {
    /** Start a PgBouncer (transaction mode, and a session-mode database) in front of the test database (see testPgBouncer()). */
    readonly pgbouncer?: boolean;
  },
): ViteUserConfig;
