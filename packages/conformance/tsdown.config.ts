import { lockkitBuild } from '@lockkit/build-config';
// The worker processes of the leases and scheduler groups are further, runnable entries.
export default lockkitBuild({
  entry: ['src/index.ts', 'src/lease-worker.ts', 'src/scheduler-worker.ts'],
});
