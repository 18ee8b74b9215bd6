import type { UserConfig } from 'tsdown';

/** The shared lockkit build (ESM + CJS + declarations from src/index.ts), with optional overrides. */
export declare function lockkitBuild(overrides?: UserConfig): UserConfig;
