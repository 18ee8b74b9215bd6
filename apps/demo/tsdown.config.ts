import { lockkitBuild } from '@lockkit/build-config';
// An app: the orchestrator and its worker process, ESM, with the private test-db launcher bundled.
export default lockkitBuild({
  entry: ['src/main.ts', 'src/worker.ts', 'src/chaos.ts', 'src/chaos-worker.ts'],
  format: ['esm'],
  dts: false,
  noExternal: [/^@lockkit\/test-db/],
});
