import { lockkitTestConfig } from '@lockkit/test-db/vitest-config';

// The suite's own checks need no server: no global setup, no per-file setup.
export default lockkitTestConfig({ globalSetup: [], setupFiles: [] });
