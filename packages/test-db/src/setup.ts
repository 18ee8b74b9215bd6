/**
 * Per-file test setup: after every test, fail it if a connection this test worker opened (tagged
 * through {@link testDatabaseUrl}'s `application_name`) still holds or awaits an advisory lock.
 */
import { afterAll, afterEach, expect } from 'vitest';
import { closeLeakChecker, leakedAdvisoryLocks } from './leaks.js';

afterEach(async () => {
  const leaked = await leakedAdvisoryLocks();
  expect(leaked, 'advisory locks left in pg_locks by this test').toEqual([]);
});

afterAll(async () => {
  await closeLeakChecker();
});
