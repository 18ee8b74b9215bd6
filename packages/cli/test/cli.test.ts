import { spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import { testDatabaseUrl } from '@lockkit/test-db';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

const cli = fileURLToPath(new URL('../dist/cli.mjs', import.meta.url));
const run = (args: string[], env: NodeJS.ProcessEnv = {}) =>
  spawnSync(process.execPath, [cli, ...args], {
    encoding: 'utf8',
    env: { ...process.env, DATABASE_URL: '', ...env },
  });

let admin: pg.Client;
const schema = `lockkit_cli_${randomBytes(5).toString('hex')}`;
beforeAll(async () => {
  admin = new pg.Client({ connectionString: testDatabaseUrl() });
  await admin.connect();
});
afterAll(async () => {
  await admin.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
  await admin.end();
});

describe('lockkit migrate', () => {
  it('creates the tables, then finds them up to date', async () => {
    const first = run(['migrate', '--url', testDatabaseUrl(), '--schema', schema, '--json']);
    expect(first.stderr).toBe('');
    expect(first.status).toBe(0);
    const result = JSON.parse(first.stdout) as { applied: number[]; from: number; to: number };
    expect(result.from).toBe(0);
    expect(result.applied).toEqual(Array.from({ length: result.to }, (_, i) => i + 1));
    const { rows } = await admin.query(
      `SELECT table_name FROM information_schema.tables WHERE table_schema = $1 ORDER BY 1`,
      [schema],
    );
    expect(rows.map((r) => r.table_name)).toEqual([
      'leases',
      'migrations',
      'runs',
      'scheduler_members',
      'schedules',
    ]);
    const again = run(['migrate', '--schema', schema], { DATABASE_URL: testDatabaseUrl() });
    expect(again.status).toBe(0);
    expect(again.stdout).toContain(`schema "${schema}" is up to date`);
  });

  it('refuses a bad schema name, a missing database and unknown commands with exit code 2', () => {
    const bad = run(['migrate', '--url', testDatabaseUrl(), '--schema', 'x; DROP TABLE y']);
    expect(bad.status).toBe(2);
    expect(bad.stderr).toContain('OPTION_INVALID');
    const noUrl = run(['migrate']);
    expect(noUrl.status).toBe(2);
    expect(noUrl.stderr).toContain('DATABASE_URL');
    const help = run(['--help']);
    expect(help.status).toBe(0);
    expect(help.stdout).toContain('migrate               create or upgrade');
  });

  it('names an unknown option in one line, with balanced quotes, and exit code 2', () => {
    const r = run(['locks', '--frobnicate']);
    expect(r.status).toBe(2);
    const first = r.stderr.split('\n')[0] as string;
    expect(first).toBe('lockkit: unknown option --frobnicate (try lockkit --help)');
    for (const quote of [`'`, '"']) expect(r.stderr.split(quote).length % 2).toBe(1);
    const missing = run(['locks', '--url']);
    expect(missing.status).toBe(2);
    expect(missing.stderr.split('\n')[0]).toBe('lockkit: --url needs a value (try lockkit --help)');
    const dashed = run(['dashboard', '--port', '-1']);
    expect(dashed.status).toBe(2);
    expect(dashed.stderr.split('\n')[0]).toBe(
      'lockkit: --port needs a value; one that starts with "-" is written --port=… (try lockkit --help)',
    );
  });

  it('reports an unreachable server with exit code 1', () => {
    const down = run(['migrate', '--url', 'postgres://postgres@127.0.0.1:1/none']);
    expect(down.status).toBe(1);
    expect(down.stderr).toContain('cannot reach the server');
  });
});
