// The shared build of every published @lockkit package: ESM + CJS + declarations from src/index.ts.
// A package extends it in two lines: `import { lockkitBuild } from '@lockkit/build-config';`
// `export default lockkitBuild();` (pass overrides for extra entries).

/**
 * @param {import('tsdown').UserConfig} [overrides]
 * @returns {import('tsdown').UserConfig}
 */
export function lockkitBuild(overrides = {}) {
  return {
    entry: ['src/index.ts'],
    format: ['esm', 'cjs'],
    dts: true,
    platform: 'node',
    target: 'node20',
    sourcemap: true,
    clean: true,
    // Peer and regular dependencies stay imports; nothing from node_modules is bundled.
    ...overrides,
  };
}
