/**
 * A real PgBouncer in front of the test database, when the `pgbouncer` binary is installed (CI
 * installs Debian's package; a laptop may not have it).
 *
 * It listens on a free loopback port with its own config, trusts every client, and offers three
 * databases: the test database itself in transaction mode (pool of 40 server connections),
 * `lockkit_single` — the same database in transaction mode through a pool of ONE server
 * connection, so that two clients are guaranteed to share it (the hazard tests need that) — and
 * `lockkit_session`, the same database in **session** mode (each client keeps one server
 * connection for its whole life; `DISCARD ALL` when it leaves, which also drops its session
 * locks).
 */
import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { chmod, chown, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { freePort, postgresUserIds } from './os-support.js';

/** A running PgBouncer. */
export interface PgBouncer {
  /** The test database through PgBouncer (transaction pooling, 40 server connections). */
  readonly url: string;
  /** The test database through PgBouncer with exactly one server connection. */
  readonly singleConnectionUrl: string;
  /** The test database through PgBouncer in session pool mode (pool of 20). */
  readonly sessionModeUrl: string;
  stop(): Promise<void>;
}

const CANDIDATES = ['/usr/sbin/pgbouncer', '/usr/bin/pgbouncer', '/usr/local/bin/pgbouncer'];

/** The pgbouncer binary, or undefined when it is not installed. */
export function findPgBouncer(): string | undefined {
  const onPath = (() => {
    try {
      return execFileSync('sh', ['-c', 'command -v pgbouncer'], { encoding: 'utf8' }).trim();
    } catch {
      return '';
    }
  })();
  return [onPath, ...CANDIDATES].find((p) => p && existsSync(p));
}

/** Starts PgBouncer in front of `databaseUrl`; rejects when the binary is missing or fails. */
export async function startPgBouncer(databaseUrl: string): Promise<PgBouncer> {
  const binary = findPgBouncer();
  if (!binary) throw new Error('pgbouncer is not installed');
  const target = new URL(databaseUrl);
  const database = decodeURIComponent(target.pathname.slice(1)) || 'postgres';
  const user = decodeURIComponent(target.username) || 'postgres';
  const host = target.hostname || '127.0.0.1';
  const serverPort = target.port || '5432';
  if (!/^[\w.-]+$/.test(database) || !/^[\w.-]+$/.test(user) || !/^[\w.:-]+$/.test(host)) {
    throw new Error(`unexpected characters in ${databaseUrl}`);
  }
  const ids = postgresUserIds();
  const dir = await mkdtemp(join(tmpdir(), 'lockkit-pgbouncer-'));
  await chmod(dir, 0o755);
  if (ids.uid !== undefined && ids.gid !== undefined) await chown(dir, ids.uid, ids.gid);
  const port = await freePort();
  const server = `host=${host} port=${serverPort} dbname=${database} user=${user}`;
  await writeFile(join(dir, 'users.txt'), `"${user}" ""\n"postgres" ""\n"root" ""\n`);
  await writeFile(
    join(dir, 'pgbouncer.ini'),
    [
      '[databases]',
      `${database} = ${server} pool_size=40`,
      `lockkit_single = ${server} pool_size=1`,
      `lockkit_session = ${server} pool_size=20 pool_mode=session`,
      '[pgbouncer]',
      'listen_addr = 127.0.0.1',
      `listen_port = ${port}`,
      `unix_socket_dir = ${dir}`,
      'pool_mode = transaction',
      'auth_type = trust',
      `auth_file = ${join(dir, 'users.txt')}`,
      'max_client_conn = 1000',
      'default_pool_size = 40',
      'ignore_startup_parameters = extra_float_digits,options',
      // Used in session mode only (transaction mode never resets): what a client leaves behind,
      // its session advisory locks included, is gone before the next client gets the server.
      'server_reset_query = DISCARD ALL',
      'log_connections = 0',
      'log_disconnections = 0',
      '',
    ].join('\n'),
  );
  const child: ChildProcess = spawn(binary, [join(dir, 'pgbouncer.ini')], {
    ...ids,
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let log = '';
  child.stderr?.on('data', (chunk: Buffer) => {
    log = (log + chunk.toString()).slice(-4000);
  });
  const failed = new Promise<never>((_, reject) => {
    child.once('error', reject);
    child.once('exit', (code) => reject(new Error(`pgbouncer exited with ${code}: ${log}`)));
  });
  failed.catch(() => {});
  const killOnExit = () => child.kill('SIGKILL');
  process.once('exit', killOnExit);
  const url = `postgres://${user}@127.0.0.1:${port}/${database}`;
  const ready = async () => {
    const deadline = Date.now() + 10_000;
    for (;;) {
      const client = new pg.Client({ connectionString: url });
      client.on('error', () => {});
      try {
        await client.connect();
        await client.query('SELECT 1');
        await client.end();
        return;
      } catch (error) {
        await client.end().catch(() => {});
        if (Date.now() > deadline) throw error;
        await new Promise((r) => setTimeout(r, 50));
      }
    }
  };
  try {
    await Promise.race([ready(), failed]);
  } catch (error) {
    child.kill('SIGKILL');
    process.removeListener('exit', killOnExit);
    await rm(dir, { recursive: true, force: true });
    throw error;
  }
  let stopped: Promise<void> | undefined;
  return {
    url,
    singleConnectionUrl: `postgres://${user}@127.0.0.1:${port}/lockkit_single`,
    sessionModeUrl: `postgres://${user}@127.0.0.1:${port}/lockkit_session`,
    stop() {
      stopped ??= (async () => {
        process.removeListener('exit', killOnExit);
        if (child.exitCode === null && child.signalCode === null) {
          const exited = new Promise((r) => child.once('exit', r));
          child.kill('SIGINT');
          await exited;
        }
        await rm(dir, { recursive: true, force: true });
      })();
      return stopped;
    },
  };
}
