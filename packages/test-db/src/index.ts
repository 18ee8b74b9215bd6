export { resolveTestDatabase, type TestDatabase, type TestDatabaseSource } from './database.js';
export { type EmbeddedServer, embeddedBinaries, startEmbeddedPostgres } from './embedded.js';
export {
  closeLeakChecker,
  leakedAdvisoryLocks,
  type SeenLock,
  testApplicationName,
  testDatabaseBaseUrl,
  testDatabaseUrl,
  testPgBouncer,
} from './leaks.js';
export { freePort, type Ids, postgresUserIds } from './os-support.js';
export { findPgBouncer, type PgBouncer, startPgBouncer } from './pgbouncer.js';
export {
  type ReplicatedPair,
  type ReplicatedPairOptions,
  type ReplicationLag,
  startReplicatedPair,
} from './replicated-pair.js';
export { createDmlOnlyRole, type TestRole } from './roles.js';
