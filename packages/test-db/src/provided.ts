/**
 * What the global setup hands to test files through vitest's `provide` / `inject`.
 */
declare module 'vitest' {
  export interface ProvidedContext {
    /** URL of the run's real PostgreSQL. */
    lockkitDatabaseUrl: string;
    /** Where it came from: `DATABASE_URL`, a container, or an embedded server. */
    lockkitDatabaseSource: 'env' | 'container' | 'embedded';
    /** The database through a transaction-pooling PgBouncer; empty when it is not available. */
    lockkitPgBouncerUrl: string;
    /** The same through a PgBouncer pool of exactly one server connection; empty when unavailable. */
    lockkitPgBouncerSingleUrl: string;
    /** The same through PgBouncer in session pool mode; empty when unavailable. */
    lockkitPgBouncerSessionUrl: string;
    /** Why PgBouncer is not available (empty when it is). */
    lockkitPgBouncerMissing: string;
  }
}

export {};
