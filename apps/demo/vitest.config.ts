import { lockkitTestConfig } from '@lockkit/test-db/vitest-config';
export default lockkitTestConfig({ testTimeout: 180_000 });
