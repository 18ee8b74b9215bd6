/**
 * The CLI given fuzzed bad arguments: it exits 2 (bad usage) or 1 (the database failed) with one
 * clear `lockkit: …` line and no stack trace, never echoes a password from a URL, and creates
 * nothing in the database for an invalid schema name.
 */
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { testDatabaseUrl } from '@lockkit/test-db';
import fc from 'fast-check';
import pg from 'pg';
import { describe, expect, it } from 'vitest';

const cli = fileURLToPath(new URL('../dist/cli.mjs', import.meta.url));
const run = (args: readonly string[]) =>
  spawnSync(process.execPath, [cli, ...args], {
    encoding: 'utf8',
    env: { ...process.env, DATABASE_URL: '' },
    timeout: 20_000,
  });

const COMMANDS = ['locks', 'leases', 'runs', 'key', 'migrate', 'doctor', 'watch', 'dashboard'];
const SECRET = 'hunter2-s3cret';
const badValue = fc.constantFrom(
  '',
  '-1',
  'abc',
  '1e999',
  "'; DROP TABLE x; --",
  'a;b',
  '\u0001\t',
  'x'.repeat(300),
  `postgres://u:${SECRET}@127.0.0.1:1/db`,
  `postgres://u:${SECRET}@[::1`,
  'not a url',
);
const badArgs = fc.oneof(
  fc.tuple(fc.constantFrom('frob', 'LOCKS', '--', 'lock'), badValue).map(([c, v]) => [c, v]),
  fc
    .tuple(
      fc.constantFrom(...COMMANDS),
      fc.constantFrom('--url', '--schema', '--name', '--interval', '--port', '--host', '--bogus'),
      badValue,
    )
    .map(([c, flag, v]) => [c, flag, v]),
  // Any non-empty name up to 1,024 bytes is a valid key name: these are not.
  fc
    .tuple(fc.constantFrom('', 'é'.repeat(600)), badValue, fc.boolean())
    .map(([bad, other, first]) => ['key', first ? bad : other, first ? other : bad]),
  fc.constantFrom(
    ['key'],
    ['key', 'only-one'],
    ['locks', '--name', 'no-slash'],
    ['watch', '--interval', '0'],
  ),
);

describe('lockkit with bad arguments', () => {
  it('answers with one clear line and a usage or failure exit code, never a stack or a password', () => {
    fc.assert(
      fc.property(badArgs, (args) => {
        const r = run(args);
        expect([1, 2], `exit code for ${JSON.stringify(args)}: ${r.stderr}`).toContain(r.status);
        expect(r.stderr).toMatch(/^lockkit: \S/);
        expect(r.stderr).not.toMatch(/\n\s+at /); // no stack trace without --verbose
        expect(r.stderr + r.stdout).not.toContain(SECRET);
      }),
      { numRuns: 40 },
    );
    // 40 CLI processes started one after the other: CPU-bound, not a timing check. 15.8 s in a
    // whole-suite run beside stress-ng, over 30 s (the default bound) in the next one.
  }, 300_000);

  it('creates nothing for an invalid schema name', async () => {
    const bad = ['a;b', '1x', 'x'.repeat(64), 'drop schema public'];
    for (const schema of bad) {
      const r = run(['migrate', '--url', testDatabaseUrl(), '--schema', schema]);
      expect(r.status).toBe(2);
    }
    const client = new pg.Client({ connectionString: testDatabaseUrl() });
    await client.connect();
    const { rows } = await client.query(
      'SELECT count(*)::int AS n FROM information_schema.schemata WHERE schema_name = ANY($1)',
      [bad],
    );
    await client.end();
    expect(rows[0].n).toBe(0);
  });
});
