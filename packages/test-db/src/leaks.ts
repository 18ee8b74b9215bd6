/**
 * The outside view of a test worker's locks: its own `pg` connection reading `pg_locks`.
 */
import pg from 'pg';
import { inject } from 'vitest';
import './provided.js';

const workerTag = `lockkit-test-${process.pid}`;
let checker: pg.Client | undefined;

/** The URL of the run's test database. */
export function testDatabaseBaseUrl(): string {
  return inject('lockkitDatabaseUrl');
}

/**
 * The run's database URL, tagged with this worker's `application_name` so that the after-each
 * leak check can tell this worker's connections from everyone else's.
 */
export function testDatabaseUrl(): string {
  const url = new URL(testDatabaseBaseUrl());
  url.searchParams.set('application_name', workerTag);
  return url.toString();
}

/** This worker's `application_name`. */
export function testApplicationName(): string {
  return workerTag;
}

async function checkerClient(): Promise<pg.Client> {
  if (!checker) {
    const client = new pg.Client({
      connectionString: testDatabaseBaseUrl(),
      application_name: 'lockkit-test-checker',
    });
    client.on('error', () => {});
    await client.connect();
    checker = client;
  }
  return checker;
}

/** One advisory lock found in `pg_locks`. */
export interface SeenLock {
  readonly pid: number;
  readonly classid: number;
  readonly objid: number;
  readonly objsubid: number;
  readonly mode: string;
  readonly granted: boolean;
}

/**
 * Advisory locks held or awaited by this worker's tagged connections. Postgres releases a dead
 * backend's locks a moment after the client sees the disconnect, so it looks again for up to
 * half a second before reporting.
 */
export async function leakedAdvisoryLocks(): Promise<SeenLock[]> {
  const client = await checkerClient();
  const deadline = Date.now() + 500;
  for (;;) {
    const { rows } = await client.query<SeenLock>(
      `SELECT l.pid, l.classid::int8::float8 AS classid, l.objid::int8::float8 AS objid,
              l.objsubid::int AS objsubid, l.mode, l.granted
         FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
        WHERE l.locktype = 'advisory' AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
          AND a.application_name = $1`,
      [workerTag],
    );
    if (rows.length === 0 || Date.now() > deadline) return rows;
    await new Promise((r) => setTimeout(r, 25));
  }
}

/** Closes the checker connection (called after all tests of a file). */
export async function closeLeakChecker(): Promise<void> {
  const client = checker;
  checker = undefined;
  await client?.end();
}

/**
 * PgBouncer URLs for this run, or the reason there is none: `url` and `singleConnectionUrl` pool
 * by transaction, `sessionModeUrl` by session.
 */
export function testPgBouncer():
  | {
      readonly url: string;
      readonly singleConnectionUrl: string;
      readonly sessionModeUrl: string;
    }
  | { readonly missing: string } {
  const url = inject('lockkitPgBouncerUrl');
  if (!url) return { missing: inject('lockkitPgBouncerMissing') || 'PgBouncer was not requested' };
  const tag = (raw: string) => {
    const tagged = new URL(raw);
    tagged.searchParams.set('application_name', workerTag);
    return tagged.toString();
  };
  return {
    url: tag(url),
    singleConnectionUrl: tag(inject('lockkitPgBouncerSingleUrl')),
    sessionModeUrl: tag(inject('lockkitPgBouncerSessionUrl')),
  };
}
