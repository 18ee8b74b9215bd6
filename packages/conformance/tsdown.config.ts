import { lockkitBuild } from '@lockkit/build-config';
// The worker process of the leases group is a second, runnable entry.
export default lockkitBuild({ entry: ['src/index.ts', 'src/lease-worker.ts'] });
