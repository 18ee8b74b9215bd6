/**
 * The versioned schema of lockkit's tables (leases now; the scheduler ledger later), applied in
 * order by `migrate()`. A migration is never edited once released: add a new one.
 * `$schema` stands for the quoted schema name.
 */

/** One schema change. */
export interface Migration {
  readonly version: number;
  readonly description: string;
  readonly statements: readonly string[];
}

/** Every migration, in order. */
export const MIGRATIONS: readonly Migration[] = [
  {
    version: 1,
    description: 'leases with fencing tokens',
    statements: [
      `CREATE TABLE $schema.leases (
         namespace    text        NOT NULL,
         job_key      text        NOT NULL,
         token        bigint      NOT NULL DEFAULT 0,
         status       text        NOT NULL CHECK (status IN ('IN_PROGRESS', 'COMPLETED', 'FAILED')),
         owner        text,
         claimed_at   timestamptz,
         heartbeat_at timestamptz,
         expires_at   timestamptz,
         finished_at  timestamptz,
         attempts     bigint      NOT NULL DEFAULT 0,
         last_error   text,
         PRIMARY KEY (namespace, job_key)
       )`,
      `COMMENT ON TABLE $schema.leases IS
         'lockkit leases: one row per job; token is the fencing token, bumped on every claim'`,
    ],
  },
  {
    version: 2,
    description: 'scheduler ledger: one row per job and scheduled tick',
    statements: [
      `CREATE TABLE $schema.runs (
         job          text        NOT NULL,
         tick         timestamptz NOT NULL,
         status       text        NOT NULL CHECK (status IN
                        ('RUNNING', 'SUCCEEDED', 'FAILED', 'SKIPPED_OVERLAP', 'MISSED', 'ABANDONED')),
         owner        text,
         attempt      integer     NOT NULL DEFAULT 1,
         token        bigint,
         started_at   timestamptz,
         finished_at  timestamptz,
         error        text,
         PRIMARY KEY (job, tick)
       )`,
      `COMMENT ON TABLE $schema.runs IS
         'lockkit scheduler ledger: the primary key (job, tick) makes each scheduled tick run at most once'`,
    ],
  },
];

/** The latest schema version. */
export const LATEST_VERSION = MIGRATIONS[MIGRATIONS.length - 1]?.version ?? 0;

/** Statements that run before reading the applied version (idempotent). */
export const BOOTSTRAP = [
  'CREATE SCHEMA IF NOT EXISTS $schema',
  `CREATE TABLE IF NOT EXISTS $schema.migrations (
     version     integer     PRIMARY KEY,
     description text        NOT NULL,
     applied_at  timestamptz NOT NULL DEFAULT now()
   )`,
] as const;

/**
 * Whether the migrations table exists, without any DDL: one row, `present`. $1 is the schema's
 * unquoted name. Read first, so that an application role without CREATE rights finds a current
 * schema without touching it.
 */
export const MIGRATIONS_TABLE_PRESENT =
  "SELECT to_regclass(format('%I.migrations', $1::text)) IS NOT NULL AS present";

/** The highest applied version: one row, `version`. */
export const APPLIED_VERSION =
  'SELECT coalesce(max(version), 0)::int AS version FROM $schema.migrations';

/** Records one applied migration ($1 version, $2 description). */
export const RECORD_MIGRATION =
  'INSERT INTO $schema.migrations (version, description) VALUES ($1::int4, $2::text)';

/** Puts the quoted schema name into a statement. */
export function inSchema(statement: string, quotedSchema: string): string {
  return statement.replaceAll('$schema', quotedSchema);
}
