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

  it('restarts on the same data and port, cutting every connection, fast or like a crash', async () => {
    const server = await startEmbeddedPostgres({ durable: true });
    try {
      const client = new pg.Client({ connectionString: server.url });
      client.on('error', () => {});
      await client.connect();
      await client.query('CREATE TABLE kept (id int); INSERT INTO kept VALUES (1)');
      const ended = new Promise((resolve) => client.once('end', resolve));
      await server.restart('immediate');
      await ended; // the old connection was cut
      for (const mode of ['fast', 'immediate'] as const) {
        if (mode === 'fast') await server.restart(mode);
        const again = new pg.Client({ connectionString: server.url });
        again.on('error', () => {});
        await again.connect();
        const { rows } = await again.query<{ n: number }>('SELECT count(*)::int AS n FROM kept');
        await again.end();
        expect(rows[0]?.n).toBe(1);
      }
    } finally {
      await server.stop();
    }
  });

  it('stays down for downMs before it starts again', async () => {
    const server = await startEmbeddedPostgres({ durable: true });
    try {
      const restarted = server.restart('immediate', 1500);
      await new Promise((resolve) => setTimeout(resolve, 700));
      const during = new pg.Client({ connectionString: server.url, connectionTimeoutMillis: 500 });
      during.on('error', () => {});
      await expect(during.connect()).rejects.toThrow();
      await restarted;
      const after = new pg.Client({ connectionString: server.url });
      after.on('error', () => {});
      await after.connect();
      const { rows } = await after.query<{ one: number }>('SELECT 1 AS one');
      await after.end();
      expect(rows[0]?.one).toBe(1);
    } finally {
      await server.stop();
    }
  });
});
