/**
 * The demo end to end, as a user runs it: worker processes on skewed clocks, one killed midway,
 * and a verdict of zero duplicates and zero missed ticks, read from the database.
 */
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { testDatabaseBaseUrl } from '@lockkit/test-db';
import { describe, expect, it } from 'vitest';

const main = fileURLToPath(new URL('../dist/main.mjs', import.meta.url));

function demo(args: string[]): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [main, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (c: Buffer) => {
      stdout += c.toString();
    });
    child.stderr.on('data', (c: Buffer) => {
      stderr += c.toString();
    });
    child.on('exit', (code) => resolve({ code, stdout, stderr }));
  });
}

describe('pnpm demo', () => {
  it.each(['pg', 'postgres', 'drizzle', 'prisma'])(
    'on %s: 3 workers, clocks ±800 ms, one killed midway — every tick exactly once',
    async (adapter) => {
      const r = await demo([
        '--url',
        testDatabaseBaseUrl(),
        '--adapter',
        adapter,
        '--workers',
        '3',
        '--seconds',
        '12',
        '--json',
      ]);
      expect(r.stderr).toBe('');
      const last = r.stdout.trim().split('\n').at(-1) as string;
      const verdict = JSON.parse(last) as Record<string, unknown>;
      expect(verdict).toMatchObject({
        adapter,
        workers: 3,
        killed: 'w2',
        duplicates: 0,
        missed: 0,
      });
      expect(verdict.ticksDue).toBeGreaterThanOrEqual(8);
      expect(verdict.ticksRun).toBe(verdict.ticksDue);
      expect(r.code).toBe(0);
    },
  );

  it('piped to a file, prints plain progress lines (no clear-screen frames) and the verdict', async () => {
    const r = await demo(['--url', testDatabaseBaseUrl(), '--workers', '2', '--seconds', '8']);
    expect(r.stderr).toBe('');
    expect(r.code).toBe(0);
    expect(r.stdout).not.toContain('\x1b[');
    const lines = r.stdout.trim().split('\n');
    const progress = lines.filter((l) => /^\s*\d+\/8 s\b/.test(l));
    // One line every 2 s, a kill line among them; not a frame every half second.
    expect(progress.length).toBeGreaterThanOrEqual(3);
    expect(progress.length).toBeLessThanOrEqual(6);
    expect(progress.filter((l) => l.includes('w1 killed'))).toHaveLength(1);
    for (const l of progress.filter((x) => !x.includes('killed')))
      expect(l).toMatch(/ran \d+, skipped \d+; ticks run: generate-invoices \d+, sweep-queue \d+/);
    expect(lines.at(-1)).toBe('  ✔ every tick ran exactly once');
  });

  it('refuses bad options with one clear line and a non-zero exit', async () => {
    const r = await demo(['--adapter', 'mongodb']);
    expect(r.code).toBe(1);
    expect(r.stderr.trim()).toBe(
      'lockkit demo failed: --adapter must be one of pg, postgres, prisma, drizzle, typeorm, kysely, knex',
    );
  });
});

describe('pnpm demo without a database', () => {
  it('starts its own embedded PostgreSQL, and Ctrl-C leaves no process or data directory behind', async () => {
    const { chmodSync, mkdtempSync, readdirSync, rmSync } = await import('node:fs');
    const { tmpdir } = await import('node:os');
    const { join } = await import('node:path');
    // The demo gets a temporary folder of its own (TMPDIR): in the shared one, other test runs on
    // this machine make and remove lockkit-pg… folders at any moment. 0755, because the server
    // runs as the postgres user when the tests run as root, and must reach its data inside.
    const tmp = mkdtempSync(join(tmpdir(), 'lockkit-demo-test-'));
    chmodSync(tmp, 0o755);
    try {
      const env: NodeJS.ProcessEnv = { ...process.env, TMPDIR: tmp };
      delete env.DATABASE_URL;
      const child = spawn(process.execPath, [main, '--workers', '2', '--seconds', '60'], {
        stdio: ['ignore', 'pipe', 'pipe'],
        env,
      });
      let out = '';
      child.stdout.on('data', (c: Buffer) => {
        out += c.toString();
      });
      // Wait until the workers run, then press Ctrl-C.
      const started = Date.now();
      while (!/\d+\/60 s +ran \d+/.test(out) && Date.now() - started < 30_000)
        await new Promise((r) => setTimeout(r, 100));
      expect(out).toContain('starting an embedded PostgreSQL');
      // The server's data directory is in the demo's own folder, so its absence below means something.
      expect(readdirSync(tmp).some((d) => d.startsWith('lockkit-pg-'))).toBe(true);
      const exited = new Promise<number | null>((r) => child.once('exit', (code) => r(code)));
      child.kill('SIGINT');
      expect(await exited).toBe(130);
      expect(readdirSync(tmp)).toEqual([]);
      const { execFileSync } = await import('node:child_process');
      const schema = /tables ready in schema (\S+)/.exec(out)?.[1] as string;
      expect(schema).toMatch(/^lockkit_demo_/);
      const stray = execFileSync('ps', ['-eo', 'args'], { encoding: 'utf8' })
        .split('\n')
        .filter((line) => line.includes(schema) || line.includes(tmp));
      expect(stray).toEqual([]);
    } finally {
      rmSync(tmp, { recursive: true, force: true });
    }
  }, 90_000);
});
