/**
 * What the global setup hands to test files through vitest's `provide` / `inject`.
 */
declare module 'vitest' {
  export interface ProvidedContext {
    /** URL of the run's real PostgreSQL. */
    lockkitDatabaseUrl: string;
    /** Where it came from: `DATABASE_URL`, a container, or an embedded server. */
    lockkitDatabaseSource: 'env' | 'container' | 'embedded';
  }
}

export {};
