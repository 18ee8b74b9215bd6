import { existsSync } from 'node:fs';
import pg from 'pg';
import { describe, expect, it } from 'vitest';
import { resolveTestDatabase } from '../src/database.js';
import { startEmbeddedPostgres } from '../src/embedded.js';

describe('resolveTestDatabase', () => {
  it('takes DATABASE_URL first and starts nothing', async () => {
    const db = await resolveTestDatabase({ DATABASE_URL: 'postgres://u@h:1/d' });
    expect(db).toMatchObject({ url: 'postgres://u@h:1/d', source: 'env' });
    await db.stop();
  });

  it('rejects an unknown or unsatisfiable forced source', async () => {
    await expect(resolveTestDatabase({ LOCKKIT_TEST_DB: 'docker' })).rejects.toThrow(
      /must be env, container or embedded/,
    );
    await expect(resolveTestDatabase({ LOCKKIT_TEST_DB: 'env' })).rejects.toThrow(
      /DATABASE_URL is not set/,
    );
  });
});

describe('startEmbeddedPostgres', () => {
  it('starts a real server, answers queries, and leaves nothing behind when stopped', async () => {
    const server = await startEmbeddedPostgres();
    const client = new pg.Client({ connectionString: server.url });
    await client.connect();
    const { rows } = await client.query<{ v: string; dir: string }>(
      "SELECT current_setting('server_version_num') AS v, current_setting('data_directory') AS dir",
    );
    await client.end();
    const row = rows[0] as { v: string; dir: string };
    expect(Number(row.v)).toBeGreaterThanOrEqual(150000);
    expect(existsSync(row.dir)).toBe(true);
    await server.stop();
    expect(existsSync(row.dir)).toBe(false);
    const late = new pg.Client({ connectionString: server.url, connectionTimeoutMillis: 2000 });
    late.on('error', () => {});
    await expect(late.connect()).rejects.toThrow();
  });
});
