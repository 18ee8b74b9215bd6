/**
 * Running PostgreSQL's programs for a test server: a one-shot program (initdb, pg_basebackup,
 * pg_ctl) as the server's user, and the wait until a started server accepts connections. Shared
 * by the embedded server and the replicated pair.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import pg from 'pg';
import type { Ids } from './os-support.js';

/**
 * Runs `file` as the user of `ids` and resolves with its output (stdout and stderr), or rejects
 * with the end of that output when it exits non-zero. A spawn failure is a rejection, never an
 * unhandled 'error' event.
 */
export function runProgram(
  file: string,
  args: string[],
  ids: Ids,
  env: NodeJS.ProcessEnv = process.env,
): Promise<string> {
  return new Promise((resolve, reject) => {
    let output = '';
    let child: ChildProcess;
    try {
      child = spawn(file, args, { ...ids, env, stdio: ['ignore', 'pipe', 'pipe'] });
    } catch (error) {
      reject(error);
      return;
    }
    child.stdout?.on('data', (chunk: Buffer) => {
      output += chunk.toString();
    });
    child.stderr?.on('data', (chunk: Buffer) => {
      output += chunk.toString();
    });
    child.on('error', reject);
    child.on('close', (code) => {
      if (code === 0) resolve(output);
      else reject(new Error(`${file} exited with ${code}: ${output.slice(-2000)}`));
    });
  });
}

/** Resolves once the server `child` started accepts a connection on `url`; rejects past `deadline`. */
export async function waitReady(url: string, child: ChildProcess, deadline: number): Promise<void> {
  for (;;) {
    if (child.exitCode !== null) throw new Error(`postgres exited with ${child.exitCode}`);
    const client = new pg.Client({ connectionString: url });
    client.on('error', () => {});
    try {
      await client.connect();
      await client.end();
      return;
    } catch (error) {
      await client.end().catch(() => {});
      if (Date.now() > deadline) throw error;
      await new Promise((r) => setTimeout(r, 50));
    }
  }
}

/**
 * Starts the `postgres` server binary with `args` as the user of `ids` and resolves with its
 * process once it accepts connections on `url` (within 30 s); else kills it and rejects with the
 * end of its log. `detached` makes it the leader of a process group of its own, so that the
 * server and every backend it forks can be killed at once (`process.kill(-pid)`).
 */
export async function launchServer(
  binary: string,
  args: string[],
  url: string,
  ids: Ids,
  env: NodeJS.ProcessEnv,
  detached = false,
): Promise<ChildProcess> {
  const child = spawn(binary, args, { ...ids, env, detached, stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  child.stderr?.on('data', (chunk: Buffer) => {
    log = (log + chunk.toString()).slice(-4000);
  });
  const spawnFailed = new Promise<never>((_, reject) => child.once('error', reject));
  spawnFailed.catch(() => {});
  try {
    await Promise.race([waitReady(url, child, Date.now() + 30_000), spawnFailed]);
    return child;
  } catch (error) {
    child.kill('SIGKILL');
    throw new Error(`postgres did not start: ${String(error)}\n${log}`, { cause: error });
  }
}
