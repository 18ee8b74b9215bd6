/**
 * Vitest global setup: one real PostgreSQL for the whole run, handed to test files through
 * `inject('lockkitDatabaseUrl')`, stopped at the end.
 */
import type { TestProject } from 'vitest/node';
import { resolveTestDatabase } from './database.js';
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
  return () => database.stop();
}
