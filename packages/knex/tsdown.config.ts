import { lockkitBuild } from '@lockkit/build-config';
export default lockkitBuild();
