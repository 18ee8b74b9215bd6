/**
 * Creating and upgrading lockkit's tables: versioned, idempotent, and guarded by an advisory lock
 * so that many instances starting at once apply each migration exactly once.
 *
 * @packageDocumentation
 */
import { assertLockExecutor, type LockExecutor, type QueryFn } from './executor.js';
import { LockKey } from './keys.js';
import { refuseInRecovery } from './lock-engine.js';
import { ownTransaction } from './own-transaction.js';
import { quoteIdentifier } from './sql/identifiers.js';
import { lockStatement } from './sql/locks.js';
import {
  APPLIED_VERSION,
  BOOTSTRAP,
  CREATE_SCHEMA,
  inSchema,
  LATEST_VERSION,
  MIGRATIONS,
  MIGRATIONS_TABLE_PRESENT,
  RECORD_MIGRATION,
  SCHEMA_PRESENT,
} from './sql/migrations.js';

/** The schema lockkit's tables live in unless told otherwise. */
export const DEFAULT_SCHEMA = 'lockkit';

/** What {@link migrate} did. */
export interface MigrationResult {
  readonly schema: string;
  /** Version before the call. */
  readonly from: number;
  /** Version after the call (the latest). */
  readonly to: number;
  /** Versions this call applied (empty when the schema was up to date). */
  readonly applied: readonly number[];
}

/**
 * Brings lockkit's tables in `schema` (default `lockkit`) to the latest version, in one
 * transaction holding the advisory lock of `('lockkit', 'migrate:<schema>')`: safe to call from
 * every instance at start-up; exactly one applies each migration, the others wait and find it
 * done. The schema name is validated and quoted.
 *
 * When the schema is already current it reads the version and returns: no lock, no DDL. So the
 * application may run as a role with only `USAGE` on the schema and `SELECT, INSERT, UPDATE,
 * DELETE` on its tables, while a migrator role (owner of the schema) applies upgrades at deploy
 * time. A role without `CREATE` rights that finds the schema behind fails with Postgres's
 * `42501` (permission denied). A connection lost on the way rejects with `CONNECTION_LOST`
 * (`COMMIT_OUTCOME_UNKNOWN` when only COMMIT's answer was lost): call it again, it applies what is
 * missing and nothing twice.
 *
 * @example
 * ```ts
 * await migrate(pgExecutor(pool));                     // schema "lockkit"
 * await migrate(pgExecutor(pool), { schema: 'jobs' }); // schema "jobs"
 * ```
 */
export async function migrate(
  executor: LockExecutor,
  options: { readonly schema?: string } = {},
): Promise<MigrationResult> {
  assertLockExecutor(executor);
  const schemaName = options.schema ?? DEFAULT_SCHEMA;
  const schema = quoteIdentifier(schemaName);
  const guard = lockStatement(
    LockKey.fromNames('lockkit', `migrate:${schemaName}`),
    'transaction',
    'exclusive',
    true,
  );
  const appliedVersion = async (query: QueryFn): Promise<number> => {
    const [table] = await query(MIGRATIONS_TABLE_PRESENT, [schemaName]);
    if (table?.present !== true) return 0;
    const [row] = await query(inSchema(APPLIED_VERSION, schema));
    return Number(row?.version ?? 0);
  };
  // Read-only first, in a transaction of its own: a current schema needs no lock and no DDL, so
  // an application role with only SELECT/INSERT/UPDATE/DELETE on lockkit's tables starts up.
  const what = `migrate ${schemaName}`;
  const current = await ownTransaction(executor, what, appliedVersion);
  if (current >= LATEST_VERSION) {
    return { schema: schemaName, from: current, to: current, applied: [] };
  }
  // The migration in a transaction of its own, under the lock; existence is read by catalog scans
  // (see sql/migrations.ts: a cached "missing" would outlive another instance's CREATE SCHEMA).
  // A lost connection is typed (CONNECTION_LOST, or COMMIT_OUTCOME_UNKNOWN at COMMIT): calling
  // migrate() again is safe either way, since it finds what a committed run applied.
  return ownTransaction(executor, what, async (query) => {
    // On a standby the guard takes nothing: refused before any DDL would fail there with 25006.
    const [locked] = await query(guard.text, guard.params);
    if (locked) refuseInRecovery(locked, what);
    const [found] = await query(SCHEMA_PRESENT, [schemaName]);
    if (found?.present !== true) await query(inSchema(CREATE_SCHEMA, schema));
    for (const statement of BOOTSTRAP) await query(inSchema(statement, schema));
    // Another instance may have migrated while this one waited for the lock.
    const from = await appliedVersion(query);
    const applied: number[] = [];
    for (const migration of MIGRATIONS) {
      if (migration.version <= from) continue;
      for (const statement of migration.statements) await query(inSchema(statement, schema));
      await query(inSchema(RECORD_MIGRATION, schema), [migration.version, migration.description]);
      applied.push(migration.version);
    }
    return { schema: schemaName, from, to: Math.max(from, LATEST_VERSION), applied };
  });
}
