import { lockkitBuild } from '@lockkit/build-config';
// The command (with its shebang) and the dashboard server, which the demo embeds too. ESM only.
export default lockkitBuild({ entry: ['src/cli.ts', 'src/dashboard.ts'], format: ['esm'] });
