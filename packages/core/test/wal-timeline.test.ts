/**
 * Leases on an engine that will not tell its WAL position: Aurora PostgreSQL answers
 * `pg_current_wal_lsn()` with SQLSTATE 0A000 ("not supported for Aurora"). Simulated here by a
 * function of that name in a schema ahead of `pg_catalog` on the connection's `search_path`, which
 * raises the same error. Claims must still work there — tokens counting up without an epoch —
 * and keep their epoch on a real server.
 */
import { randomBytes } from 'node:crypto';
import { testDatabaseBaseUrl } from '@lockkit/test-db';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { tokenParts } from '../src/lease.js';
import { createLockClient } from '../src/lock.js';
import { poolExecutor } from './client-executor.js';

const tag = randomBytes(4).toString('hex');
const stub = `lockkit_aurora_stub_${tag}`;
const schema = `lockkit_timeline_${tag}`;
let admin: pg.Client;
const pools: pg.Pool[] = [];

function pool(searchPath?: string): pg.Pool {
  const url = new URL(testDatabaseBaseUrl());
  if (searchPath) url.searchParams.set('options', `-c search_path=${searchPath}`);
  const p = new pg.Pool({ connectionString: url.toString(), max: 4 });
  p.on('error', () => {});
  pools.push(p);
  return p;
}

beforeAll(async () => {
  admin = new pg.Client({ connectionString: testDatabaseBaseUrl() });
  await admin.connect();
  await admin.query(`CREATE SCHEMA "${stub}"`);
  await admin.query(`CREATE FUNCTION "${stub}".pg_current_wal_lsn() RETURNS pg_lsn LANGUAGE plpgsql AS $$
    BEGIN RAISE EXCEPTION 'Function pg_current_wal_lsn() is currently not supported for Aurora'
      USING ERRCODE = '0A000'; END $$`);
});

afterAll(async () => {
  await Promise.all(pools.map((p) => p.end()));
  await admin.query(`DROP SCHEMA IF EXISTS "${stub}" CASCADE`);
  await admin.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
  await admin.end();
});

describe('the epoch of fencing tokens, where the engine hides its WAL position', () => {
  it('claims without an epoch, counting up by one, instead of failing every claim', async () => {
    const p = pool(`"${stub}",pg_catalog`);
    // The stub is what this connection calls, as on Aurora.
    await expect(p.query('SELECT pg_current_wal_lsn()')).rejects.toMatchObject({ code: '0A000' });
    const locks = createLockClient(poolExecutor(p), { schema });
    await locks.migrate();
    const first = await locks.runWithLease('timeline', 'aurora', async () => 'ran');
    const second = await locks.runWithLease('timeline', 'aurora', async () => 'ran');
    expect(first).toMatchObject({ executed: true, result: 'ran' });
    expect(second).toMatchObject({ executed: true, result: 'ran' });
    if (!first.executed || !second.executed) throw new Error('unreachable');
    expect(second.token).toBe(first.token + 1n);
    expect(tokenParts(first.token).timeline).toBe(0);
  });

  it('keeps the timeline in the token on a server that tells it', async () => {
    const locks = createLockClient(poolExecutor(pool()), { schema });
    await locks.migrate();
    const { rows } = await admin.query<{ timeline: string }>(
      `SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int8::text AS timeline`,
    );
    const run = await locks.runWithLease('timeline', 'postgres', async () => 'ran');
    if (!run.executed) throw new Error('the lease was not claimed');
    expect(tokenParts(run.token).timeline).toBe(Number(rows[0]?.timeline));
    expect(tokenParts(run.token).timeline).toBeGreaterThanOrEqual(1);
  });
});
