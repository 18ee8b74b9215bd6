/**
 * Vitest global setup: one real PostgreSQL for the whole run, handed to test files through
 * `inject('lockkitDatabaseUrl')`, stopped at the end.
 */
import type { TestProject } from 'vitest/node';
import { resolveTestDatabase } from './database.js';
import { findPgBouncer, type PgBouncer, startPgBouncer } from './pgbouncer.js';
import './provided.js';

export default async function setup(project: TestProject): Promise<() => Promise<void>> {
  const started = Date.now();
  const database = await resolveTestDatabase();
  project.provide('lockkitDatabaseUrl', database.url);
  project.provide('lockkitDatabaseSource', database.source);
  const where = database.url.replace(/\/\/[^@/]*@/, '//');
  console.log(
    `[lockkit test-db] ${database.source} PostgreSQL at ${where} (${Date.now() - started} ms)`,
  );
  // PgBouncer only for packages that ask for it (LOCKKIT_TEST_WANTS_PGBOUNCER=1 in their config),
  // unless this run leaves it out (LOCKKIT_TEST_PGBOUNCER=0).
  let bouncer: PgBouncer | undefined;
  let missing = '';
  if (process.env.LOCKKIT_TEST_WANTS_PGBOUNCER === '1') {
    if (process.env.LOCKKIT_TEST_PGBOUNCER === '0') {
      // A second pass over another server can leave the PgBouncer cases to the first (CI does).
      missing = 'LOCKKIT_TEST_PGBOUNCER=0 leaves PgBouncer out of this run';
      console.log(`[lockkit test-db] PgBouncer tests will be skipped: ${missing}`);
    } else if (findPgBouncer()) {
      bouncer = await startPgBouncer(database.url);
    } else {
      missing = 'pgbouncer is not installed (Debian: apt-get install pgbouncer)';
      if (process.env.LOCKKIT_TEST_REQUIRE_PGBOUNCER === '1') {
        await database.stop();
        throw new Error(`LOCKKIT_TEST_REQUIRE_PGBOUNCER=1 but ${missing}`);
      }
      console.log(`[lockkit test-db] PgBouncer tests will be skipped: ${missing}`);
    }
  }
  project.provide('lockkitPgBouncerUrl', bouncer?.url ?? '');
  project.provide('lockkitPgBouncerSingleUrl', bouncer?.singleConnectionUrl ?? '');
  project.provide('lockkitPgBouncerSessionUrl', bouncer?.sessionModeUrl ?? '');
  project.provide('lockkitPgBouncerMissing', missing);
  if (bouncer)
    console.log(
      `[lockkit test-db] PgBouncer at ${bouncer.url} (transaction mode; session mode at ${bouncer.sessionModeUrl})`,
    );
  return async () => {
    await bouncer?.stop();
    await database.stop();
  };
}
