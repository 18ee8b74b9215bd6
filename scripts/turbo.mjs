/**
 * How the root scripts start turbo and programs: the repository's own pinned turbo (so that
 * `node scripts/…` works without pnpm's PATH), no telemetry notice, and a build that says what it
 * is doing instead of keeping quiet for half a minute.
 */
import { spawn } from 'node:child_process';
import { constants } from 'node:os';
import { resolve } from 'node:path';

/** The repository root. */
export const root = resolve(import.meta.dirname, '..');

const turboBin = resolve(root, 'node_modules/.bin/turbo');
const turboEnv = () => ({ ...process.env, TURBO_TELEMETRY_DISABLED: '1' });

const exitCode = (code, signal) => code ?? 128 + (constants.signals[signal] ?? 0);

/**
 * Runs a command on this terminal and resolves to its exit code (128 + signal number when it was
 * killed). Ctrl-C reaches the child from the terminal; this process waits for it to clean up and
 * end rather than dying first. A SIGTERM sent to this process alone is passed on.
 */
export function run(command, args, options = {}) {
  return new Promise((done, fail) => {
    const child = spawn(command, args, { cwd: root, stdio: 'inherit', ...options });
    const ignore = () => {};
    const forward = () => child.kill('SIGTERM');
    process.on('SIGINT', ignore);
    process.on('SIGTERM', forward);
    const settle = () => {
      process.off('SIGINT', ignore);
      process.off('SIGTERM', forward);
    };
    child.once('error', (error) => {
      settle();
      fail(error);
    });
    child.once('exit', (code, signal) => {
      settle();
      done(exitCode(code, signal));
    });
  });
}

/** `turbo <args>` on this terminal; resolves to its exit code. */
export function turbo(args) {
  return run(turboBin, args, { env: turboEnv() });
}

/**
 * Builds `packages` (workspace names) and everything they use. Says nothing when turbo's cache
 * has it all; otherwise one line per package it builds, on stderr (stdout stays the program's:
 * `pnpm demo --json | tail -n 1` is one JSON object). turbo's own output is shown only when the
 * build fails, and then this process exits with turbo's code.
 */
export async function buildWithProgress(packages, what) {
  const started = Date.now();
  const filters = packages.map((name) => `--filter=${name}...`);
  const child = spawn(turboBin, ['run', 'build', ...filters, '--output-logs=new-only'], {
    cwd: root,
    env: { ...turboEnv(), FORCE_COLOR: '0' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  let partial = '';
  let building = 0;
  const onData = (chunk) => {
    output += chunk;
    const lines = (partial + chunk).split('\n');
    partial = lines.pop() ?? '';
    for (const line of lines) {
      const miss = /^(\S+):build: cache (?:miss|bypass)/.exec(line);
      if (!miss) continue;
      if (building++ === 0) process.stderr.write(`building ${what}:\n`);
      process.stderr.write(`  ${miss[1]}\n`);
    }
  };
  child.stdout.setEncoding('utf8').on('data', onData);
  child.stderr.setEncoding('utf8').on('data', onData);
  const code = await new Promise((done, fail) => {
    child.once('error', fail);
    child.once('exit', (c, signal) => done(exitCode(c, signal)));
  });
  if (code !== 0) {
    process.stderr.write(
      `${output}\nthe build failed (turbo exited with ${code}); its output is above\n`,
    );
    process.exit(code);
  }
  if (building > 0) {
    const seconds = Math.round((Date.now() - started) / 1000);
    process.stderr.write(`built ${building} package${building === 1 ? '' : 's'} in ${seconds} s\n`);
  }
}
