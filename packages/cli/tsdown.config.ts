import { lockkitBuild } from '@lockkit/build-config';
// A command, not a library: one ESM entry with its shebang, no declarations.
export default lockkitBuild({ entry: ['src/cli.ts'], format: ['esm'], dts: false });
