import { lockkitTestConfig } from '@lockkit/test-db/vitest-config';
export default lockkitTestConfig({}, { pgbouncer: true });
