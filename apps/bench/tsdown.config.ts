import { lockkitBuild } from '@lockkit/build-config';
// An app, not a library: one ESM entry, with the private test-db helpers bundled in.
export default lockkitBuild({
  entry: [
    'src/main.ts',
    'src/memory-probe.ts',
    'src/scale-worker.ts',
    'src/ceiling-worker.ts',
    'src/claim-model-worker.ts',
    'src/lease-contenders.ts',
    'src/inspect-ledger.ts',
  ],
  format: ['esm'],
  dts: false,
  noExternal: [/^@lockkit\/test-db/],
});
