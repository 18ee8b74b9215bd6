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
  {
    version: 3,
    description:
      'scheduler ledger protocol: namespaces, schedule hashes, durable retries and queued ticks (PENDING), registered schedules',
    statements: [
      `ALTER TABLE $schema.runs ADD COLUMN namespace text NOT NULL DEFAULT ''`,
      'ALTER TABLE $schema.runs ADD COLUMN schedule_hash text',
      'ALTER TABLE $schema.runs ADD COLUMN retry_at timestamptz',
      'ALTER TABLE $schema.runs DROP CONSTRAINT runs_pkey',
      'ALTER TABLE $schema.runs ADD PRIMARY KEY (namespace, job, tick)',
      'ALTER TABLE $schema.runs DROP CONSTRAINT runs_status_check',
      `ALTER TABLE $schema.runs ADD CONSTRAINT runs_status_check CHECK (status IN
         ('PENDING', 'RUNNING', 'SUCCEEDED', 'FAILED', 'SKIPPED_OVERLAP', 'MISSED', 'ABANDONED'))`,
      `CREATE INDEX runs_pending ON $schema.runs (namespace, job, tick) WHERE status = 'PENDING'`,
      // Readers that go by job across namespaces (inspect, the dashboard) keep their index.
      'CREATE INDEX runs_job_tick ON $schema.runs (job, tick)',
      `COMMENT ON COLUMN $schema.runs.retry_at IS
         'PENDING rows (a retry, a queued tick, a tick given back): due to run from this instant'`,
      `CREATE TABLE $schema.schedules (
         namespace     text        NOT NULL,
         job           text        NOT NULL,
         owner         text        NOT NULL,
         cron          text        NOT NULL,
         timezone      text        NOT NULL,
         schedule_hash text        NOT NULL,
         heartbeat_at  timestamptz NOT NULL DEFAULT now(),
         PRIMARY KEY (namespace, job, owner)
       )`,
      `COMMENT ON TABLE $schema.schedules IS
         'lockkit scheduler registrations: which instance registered which job on which schedule (schedule conflicts)'`,
    ],
  },
  {
    version: 4,
    description: 'scheduler members: the running instances of a namespace, for owned distribution',
    statements: [
      `CREATE TABLE $schema.scheduler_members (
         namespace    text        NOT NULL,
         member       text        NOT NULL,
         -- the process behind the member id: a new one each start
         incarnation  text        NOT NULL,
         heartbeat_at timestamptz NOT NULL,
         expires_at   timestamptz NOT NULL,
         -- the last heartbeat of the previous incarnation under this member id, if one was replaced
         predecessor_at timestamptz,
         PRIMARY KEY (namespace, member)
       )`,
      `COMMENT ON TABLE $schema.scheduler_members IS
         'lockkit scheduler members: one row per running instance (distribution: owned); live while expires_at is ahead of the database clock'`,
    ],
  },
];

/** The latest schema version. */
export const LATEST_VERSION = MIGRATIONS[MIGRATIONS.length - 1]?.version ?? 0;

/*
 * Why existence is read by scanning the catalogs rather than with to_regclass() or IF NOT EXISTS:
 * a name looked up through the catalog caches and not found stays cached as missing in that
 * backend until it processes invalidations — which waiting on an advisory lock does not do. An
 * instance that looked first, then waited while another created the schema, would then run
 * CREATE SCHEMA IF NOT EXISTS against its stale "missing" and fail with a duplicate key (23505).
 * A catalog scan reads with the statement's own snapshot and caches nothing.
 */

/** Whether the schema exists: one row, `present`. $1 is the schema's unquoted name. */
export const SCHEMA_PRESENT =
  'SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = $1::text) AS present';

/** Creates the schema; run only under the migration lock, after {@link SCHEMA_PRESENT} said no. */
export const CREATE_SCHEMA = 'CREATE SCHEMA $schema';

/**
 * Whether the migrations table exists, without any DDL: one row, `present`. $1 is the schema's
 * unquoted name. Read first, so that an application role without CREATE rights finds a current
 * schema without touching it.
 */
export const MIGRATIONS_TABLE_PRESENT = `
  SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class c
                   JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                  WHERE n.nspname = $1::text AND c.relname = 'migrations') AS present`;

/**
 * Statements that run under the migration lock, once the schema exists, before reading the applied
 * version (idempotent; CREATE TABLE locks the schema first, which refreshes the caches).
 */
export const BOOTSTRAP = [
  `CREATE TABLE IF NOT EXISTS $schema.migrations (
     version     integer     PRIMARY KEY,
     description text        NOT NULL,
     applied_at  timestamptz NOT NULL DEFAULT now()
   )`,
] as const;

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
