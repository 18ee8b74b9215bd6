import { lockkitBuild } from '@lockkit/build-config';
export default lockkitBuild({ entry: ['src/index.ts', 'src/adapter.ts'] });
