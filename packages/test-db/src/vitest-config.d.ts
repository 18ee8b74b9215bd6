import type { ViteUserConfig } from 'vitest/config';

/** Vitest config with the test-database global setup and the per-test lock-leak check. */
export declare function lockkitTestConfig(overrides?: ViteUserConfig['test']): ViteUserConfig;
