/**
 * Least-privilege roles for tests: an application role that may read and write lockkit's tables
 * and nothing more (no CREATE on the database or the schema), as a careful operator sets one up.
 */
import { randomBytes } from 'node:crypto';
import pg from 'pg';

/** A throwaway login role and a URL that connects as it. */
export interface TestRole {
  readonly role: string;
  /** `adminUrl` with this role's name and password. */
  readonly url: string;
  /** Drops the role and what it was granted; close its connections first. */
  drop(): Promise<void>;
}

/**
 * Creates a login role with only `USAGE` on `schema` and `SELECT, INSERT, UPDATE, DELETE` on the
 * tables in it now (lockkit's leases, runs and migrations after `migrate()`): no DDL anywhere.
 * `adminUrl` must connect as a role allowed to create roles.
 */
export async function createDmlOnlyRole(adminUrl: string, schema: string): Promise<TestRole> {
  if (!/^[a-z_][a-z0-9_]*$/.test(schema)) throw new Error(`unexpected schema name ${schema}`);
  const role = `lockkit_app_${randomBytes(5).toString('hex')}`;
  const password = randomBytes(12).toString('hex');
  const admin = new pg.Client({ connectionString: adminUrl });
  await admin.connect();
  try {
    await admin.query(`CREATE ROLE ${role} LOGIN PASSWORD '${password}'`);
    await admin.query(`GRANT USAGE ON SCHEMA ${schema} TO ${role}`);
    await admin.query(
      `GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA ${schema} TO ${role}`,
    );
  } finally {
    await admin.end();
  }
  const url = new URL(adminUrl);
  url.username = role;
  url.password = password;
  return {
    role,
    url: url.toString(),
    async drop() {
      const client = new pg.Client({ connectionString: adminUrl });
      await client.connect();
      try {
        await client.query(
          'SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1',
          [role],
        );
        await client.query(`DROP OWNED BY ${role}`);
        await client.query(`DROP ROLE ${role}`);
      } finally {
        await client.end();
      }
    },
  };
}
