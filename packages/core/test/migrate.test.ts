/**
 * migrate() with least privilege: once the migrator role has created the tables, an application
 * role that may only read and write them starts up fine — migrate() then runs no DDL at all.
 */
import { randomBytes } from 'node:crypto';
import { createDmlOnlyRole, type TestRole, testDatabaseBaseUrl } from '@lockkit/test-db';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLockClient } from '../src/lock.js';
import { migrate } from '../src/migrate.js';
import { LATEST_VERSION } from '../src/sql/migrations.js';
import { clientExecutor } from './client-executor.js';

const schema = `lockkit_migrate_${randomBytes(4).toString('hex')}`;
let admin: pg.Client;
let role: TestRole;

beforeAll(async () => {
  admin = new pg.Client({ connectionString: testDatabaseBaseUrl() });
  await admin.connect();
});
afterAll(async () => {
  await role?.drop();
  await admin.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
  await admin.end();
});

describe('migrate() under a DML-only application role', () => {
  it('finds the schema current and runs no DDL, so the application starts', async () => {
    const first = await migrate(clientExecutor(admin), { schema });
    expect(first.applied.length).toBe(LATEST_VERSION);
    role = await createDmlOnlyRole(testDatabaseBaseUrl(), schema);
    const app = new pg.Client({ connectionString: role.url });
    await app.connect();
    try {
      // The premise: this role really cannot run DDL.
      await expect(app.query(`CREATE SCHEMA IF NOT EXISTS "${schema}"`)).rejects.toMatchObject({
        code: '42501',
      });
      const statements: string[] = [];
      const executor = clientExecutor(app);
      const recording = {
        ...executor,
        transaction: <T>(fn: Parameters<typeof executor.transaction<T>>[0]) =>
          executor.transaction((ctx) =>
            fn({
              ...ctx,
              query: (text, params) => {
                statements.push(text);
                return ctx.query(text, params);
              },
            }),
          ),
      };
      const again = await migrate(recording, { schema });
      expect(again).toEqual({ schema, from: LATEST_VERSION, to: LATEST_VERSION, applied: [] });
      expect(statements.filter((s) => /^\s*(CREATE|ALTER|COMMENT|DROP)\b/i.test(s))).toEqual([]);
      // …and the application role can use lockkit: a lease is claimed, held and finished.
      const locks = createLockClient(clientExecutor(app), { schema });
      await locks.migrate();
      const r = await locks.runWithLease('billing', 'nightly', async () => 'done', {
        heartbeat: false,
      });
      expect(r).toMatchObject({ executed: true, result: 'done' });
    } finally {
      await app.end();
    }
  });

  it('still fails clearly for that role when the schema is behind: it cannot create tables', async () => {
    const behind = `${schema}_new`;
    const app = new pg.Client({ connectionString: role.url });
    await app.connect();
    try {
      await expect(migrate(clientExecutor(app), { schema: behind })).rejects.toMatchObject({
        code: '42501',
      });
    } finally {
      await app.end();
      await admin.query(`DROP SCHEMA IF EXISTS "${behind}" CASCADE`);
    }
  });
});

describe('migrate() from many instances at once', () => {
  it('applies each version once, whoever waited on whom', async () => {
    const clients = await Promise.all(
      Array.from({ length: 6 }, async () => {
        const c = new pg.Client({ connectionString: testDatabaseBaseUrl() });
        await c.connect();
        return c;
      }),
    );
    try {
      for (let round = 0; round < 5; round++) {
        const fresh = `${schema}_race_${round}`;
        try {
          const results = await Promise.all(
            clients.map((c) => migrate(clientExecutor(c), { schema: fresh })),
          );
          expect(results.filter((r) => r.applied.length > 0)).toHaveLength(1);
          expect(results.every((r) => r.to === LATEST_VERSION)).toBe(true);
        } finally {
          await admin.query(`DROP SCHEMA IF EXISTS "${fresh}" CASCADE`);
        }
      }
    } finally {
      await Promise.all(clients.map((c) => c.end()));
    }
  });
});
