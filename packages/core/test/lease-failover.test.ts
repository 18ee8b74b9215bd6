/**
 * Fencing tokens across a real failover: a primary and an asynchronous standby of our own (the
 * embedded PostgreSQL binaries; the standby is a cold copy of the primary, so no pg_basebackup is
 * needed), a claim the standby never receives, the primary lost, the standby promoted. The
 * successor has the lease row as it was before the lost claim, yet must not issue the lost
 * claim's token again: two holders with one token could not be told apart by a fenced write.
 * `LOCKKIT_FAILOVER_PG=<dir with bin/initdb, bin/pg_ctl>` runs it on other binaries instead (e.g.
 * /usr/lib/postgresql/15).
 */
import { execFile } from 'node:child_process';
import { appendFile, chmod, chown, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { embeddedBinaries, freePort, type Ids, postgresUserIds } from '@lockkit/test-db';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { LockkitError } from '../src/errors.js';
import { tokenParts } from '../src/lease.js';
import { createLockClient } from '../src/lock.js';
import { sqlState } from '../src/postgres-errors.js';
import { finishStatement, renewStatement } from '../src/sql/leases.js';
import { poolExecutor } from './client-executor.js';

/** Runs a program as the server's user; rejects with its output when it fails. */
function run(file: string, args: string[], ids: Ids): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile(
      file,
      args,
      { ...ids, env: { ...process.env, LC_ALL: 'C', LANG: 'C' } },
      (error, stdout, stderr) => {
        if (error) reject(new Error(`${file} ${args.join(' ')}: ${stderr}${stdout}`));
        else resolve(stdout);
      },
    );
  });
}

let binaries: Awaited<ReturnType<typeof embeddedBinaries>>;
let parent: string;
const pools: pg.Pool[] = [];
const pgCtl = (...args: string[]) => run(join(binaries.dir, 'bin', 'pg_ctl'), args, binaries.ids);
const dataOf = (name: string) => join(parent, name);
const start = (name: string) =>
  pgCtl('-D', dataOf(name), '-l', join(parent, `${name}.log`), '-w', 'start');
const stop = (name: string, mode: 'fast' | 'immediate') =>
  pgCtl('-D', dataOf(name), '-m', mode, '-w', 'stop');

/** A pool whose commits wait for `synchronousCommit` (`remote_apply`: applied on the standby). */
function poolOf(port: number, synchronousCommit: 'remote_apply' | 'local'): pg.Pool {
  const pool = new pg.Pool({
    connectionString: `postgres://postgres@127.0.0.1:${port}/postgres`,
    options: `-c synchronous_commit=${synchronousCommit}`,
    max: 2,
  });
  pool.on('error', () => {});
  pools.push(pool);
  return pool;
}

let primaryPort: number;
let standbyPort: number;

beforeAll(async () => {
  const other = process.env.LOCKKIT_FAILOVER_PG;
  binaries = other
    ? { dir: other, ids: postgresUserIds(), release: async () => {} }
    : await embeddedBinaries();
  parent = await mkdtemp(join(tmpdir(), 'lockkit-failover-'));
  await chmod(parent, 0o755);
  const { uid, gid } = binaries.ids;
  if (uid !== undefined && gid !== undefined) await chown(parent, uid, gid);
  await run(
    join(binaries.dir, 'bin', 'initdb'),
    ['-D', dataOf('primary'), '-U', 'postgres', '--auth=trust', '--no-sync', '--locale=C'],
    binaries.ids,
  );
  primaryPort = await freePort();
  standbyPort = await freePort();
  // Synchronous replication to whichever standby is connected, so that a pool with
  // synchronous_commit=remote_apply knows the standby has a commit; a pool with `local` does not
  // wait: that is the asynchronous replication a failover can lose commits of.
  await appendFile(
    join(dataOf('primary'), 'postgresql.conf'),
    [
      `port = ${primaryPort}`,
      `listen_addresses = '127.0.0.1'`,
      `unix_socket_directories = '${parent}'`,
      'wal_level = replica',
      'fsync = off',
      'max_connections = 30',
      `synchronous_standby_names = '*'`,
      '',
    ].join('\n'),
  );
  // A cleanly shut-down cluster is a valid base backup: copy it as the standby.
  await start('primary');
  await stop('primary', 'fast');
  // As this process's user, not the server's: the server's user may not be able to reach a `cp`
  // on this process's PATH (CI's README pass runs on a PATH of folders only root can enter), and
  // `-a` keeps the files' owner either way.
  await run('cp', ['-a', dataOf('primary'), dataOf('standby')], {});
  await appendFile(
    join(dataOf('standby'), 'postgresql.conf'),
    `port = ${standbyPort}\nprimary_conninfo = 'host=127.0.0.1 port=${primaryPort} user=postgres application_name=standby'\n`,
  );
  await writeFile(join(dataOf('standby'), 'standby.signal'), '');
  if (uid !== undefined && gid !== undefined)
    await chown(join(dataOf('standby'), 'standby.signal'), uid, gid);
  await start('primary');
  await start('standby');
}, 60_000);

afterAll(async () => {
  await Promise.all(pools.splice(0).map((p) => p.end().catch(() => {})));
  for (const name of ['standby', 'primary']) await stop(name, 'immediate').catch(() => {});
  if (parent) await rm(parent, { recursive: true, force: true });
  await binaries?.release();
}, 30_000);

describe('fencing tokens across a failover', () => {
  it('a promoted standby that lost the newest claim never issues its token again', async () => {
    const ns = 'failover';
    const job = 'nightly';
    const synced = createLockClient(poolExecutor(poolOf(primaryPort, 'remote_apply')));
    await synced.migrate();
    // The first claim reaches the standby (its commit waited until the standby applied it).
    const first = await synced.runWithLease(ns, job, () => 'ran');
    expect(first.executed).toBe(true);
    const t1 = first.executed ? first.token : 0n;

    // The standby refuses every lease statement before evaluating any of it — even a function
    // like pg_current_wal_lsn() that would raise in recovery: each one writes or locks a row, which
    // a hot standby refuses at executor start (25006, read-only transaction). Nothing is issued.
    const onStandby = poolOf(standbyPort, 'local');
    const standbyLocks = createLockClient(poolExecutor(onStandby));
    const refusals = [
      await standbyLocks.runWithLease(ns, job, () => 'ran').catch((e: unknown) => e),
      await standbyLocks
        .withFencedWrite({ namespace: ns, jobKey: job, token: t1 }, () => 'wrote')
        .catch((e: unknown) => e),
      ...(await Promise.all(
        [
          renewStatement('lockkit', ns, job, t1, 60_000),
          finishStatement('lockkit', ns, job, t1, { failed: false }),
        ].map((s) => onStandby.query(s.text, [...s.params]).catch((e: unknown) => e)),
      )),
    ];
    // lockkit's own calls may be refused earlier still, by a standby check of its own
    // (NotPrimaryError); never with a token issued.
    const refused = (e: unknown) =>
      sqlState(e) === '25006' || (e instanceof LockkitError && e.code === 'NOT_PRIMARY')
        ? 'refused'
        : e;
    expect(refusals.map(refused)).toEqual(['refused', 'refused', 'refused', 'refused']);

    // The standby stops receiving; the next claim commits on the primary alone.
    await stop('standby', 'fast');
    const unsynced = createLockClient(poolExecutor(poolOf(primaryPort, 'local')));
    const lost = await unsynced.runWithLease(ns, job, () => 'ran');
    expect(lost.executed).toBe(true);
    const t2 = lost.executed ? lost.token : 0n;
    expect(t2).toBeGreaterThan(t1);

    // The primary dies; the standby, which never saw the second claim, is promoted.
    await stop('primary', 'immediate');
    await start('standby');
    await pgCtl('-D', dataOf('standby'), '-w', 'promote');
    const promoted = poolOf(standbyPort, 'local');
    const successor = createLockClient(poolExecutor(promoted));
    const { rows } = await promoted.query(
      'SELECT token::text AS token FROM lockkit.leases WHERE namespace = $1 AND job_key = $2',
      [ns, job],
    );
    expect(BigInt(rows[0].token)).toBe(t1); // the lost claim is gone

    const after = await successor.runWithLease(ns, job, () => 'ran');
    expect(after.executed).toBe(true);
    const t3 = after.executed ? after.token : 0n;
    // Never the lost token again, and greater than every token issued before the failover.
    expect(t3).not.toBe(t2);
    expect(t3).toBeGreaterThan(t2);
    // The first claim on the promoted server's timeline (the old primary's plus one).
    expect(tokenParts(t3)).toEqual({
      ...tokenParts(t2),
      timeline: tokenParts(t2).timeline + 1,
      sequence: 0,
    });
  }, 60_000);
});
