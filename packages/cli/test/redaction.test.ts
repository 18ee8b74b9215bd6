/**
 * Passwords never reach the terminal: not through the URL redaction of messages, not through an
 * argument echoed back, whatever characters the password holds (a raw `@` included).
 */
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { redact, redactCredentials } from '../src/table.js';

const cli = fileURLToPath(new URL('../dist/cli.mjs', import.meta.url));
const run = (args: string[]) =>
  spawnSync(process.execPath, [cli, ...args], {
    encoding: 'utf8',
    env: { ...process.env, DATABASE_URL: '' },
  });

// Each password, and every piece of it longer than two characters, must stay unprinted.
const PASSWORDS = ['p@ssw0rd', 'a@b@c-secret', 's3cret:with:colons', 'pw/with/slash@x', '@leading'];
const URLS = PASSWORDS.flatMap((pw) => [
  `postgres://user:${pw}@db.example:5432/app`,
  `postgresql://user:${pw}@db.example/app?sslmode=require`,
  `postgres://us@er:${pw}@db.example/app`,
]);

function expectNoPiece(text: string, password: string): void {
  for (const piece of password.split(/[@:/]/).filter((p) => p.length > 2)) {
    expect(text, `"${piece}" of "${password}" printed in: ${text}`).not.toContain(piece);
  }
}

describe('password redaction', () => {
  it('hides every part of the password in free text, whatever it contains', () => {
    for (const url of URLS) {
      const password = PASSWORDS.find((pw) => url.includes(pw)) as string;
      const text = `connect to ${url} failed; try "${url}" again`;
      const redacted = redactCredentials(text);
      expectNoPiece(redacted, password);
      expect(redacted).toContain('***@');
      expect(redacted).toContain('db.example');
    }
  });

  it('hides it in a parsed URL too', () => {
    for (const url of URLS) {
      const password = PASSWORDS.find((pw) => url.includes(pw)) as string;
      expectNoPiece(redact(url), password);
    }
  });

  it('leaves URLs without a password alone', () => {
    const plain = 'postgres://user@db.example:5432/app and postgres://db.example/app';
    expect(redactCredentials(plain)).toBe(plain);
  });

  it('never prints a password with a raw @ from the command line', () => {
    for (const password of PASSWORDS) {
      const url = `postgres://user:${password}@127.0.0.1:1/app`;
      for (const args of [['locks', '--name', url, '--url', url], [url]]) {
        const r = run(args);
        expect(r.status, args.join(' ')).not.toBe(0);
        expectNoPiece(r.stdout + r.stderr, password);
      }
    }
  }, 30_000);
});
