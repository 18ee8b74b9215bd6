/**
 * Migration 3 (the ledger protocol) on a ledger that already has rows: applied in place, every row
 * kept (in the default namespace, without a schedule hash), and catch-up reads those rows as the
 * current schedule's, so an upgraded deployment neither re-runs nor loses a tick.
 */
import { randomBytes } from 'node:crypto';
import { testDatabaseBaseUrl } from '@lockkit/test-db';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLockClient } from '../src/lock.js';
import { migrate } from '../src/migrate.js';
import { createScheduler } from '../src/scheduler.js';
import {
  BOOTSTRAP,
  CREATE_SCHEMA,
  inSchema,
  LATEST_VERSION,
  MIGRATIONS,
  RECORD_MIGRATION,
} from '../src/sql/migrations.js';
import { clientExecutor } from './client-executor.js';

const schema = `lockkit_ledger_${randomBytes(4).toString('hex')}`;
const quoted = `"${schema}"`;
const BASE = Date.UTC(2031, 0, 1);
const at = (s: number) => new Date(BASE + s * 1000).toISOString();
let admin: pg.Client;

beforeAll(async () => {
  admin = new pg.Client({ connectionString: testDatabaseBaseUrl() });
  await admin.connect();
});
afterAll(async () => {
  await admin.query(`DROP SCHEMA IF EXISTS ${quoted} CASCADE`);
  await admin.end();
});

describe('migration 3 on a ledger with rows', () => {
  it('keeps every row, and the upgraded scheduler catches up from them', async () => {
    // A schema as version 2 left it, with a job's history.
    await admin.query(inSchema(CREATE_SCHEMA, quoted));
    for (const statement of BOOTSTRAP) await admin.query(inSchema(statement, quoted));
    for (const migration of MIGRATIONS.filter((m) => m.version <= 2)) {
      for (const statement of migration.statements) await admin.query(inSchema(statement, quoted));
      await admin.query(inSchema(RECORD_MIGRATION, quoted), [
        migration.version,
        migration.description,
      ]);
    }
    for (const [s, status] of [
      [0, 'SUCCEEDED'],
      [1, 'FAILED'],
      [2, 'SUCCEEDED'],
    ] as const) {
      await admin.query(
        `INSERT INTO ${quoted}.runs (job, tick, status, finished_at) VALUES ('legacy', $1, $2, now())`,
        [at(s), status],
      );
    }
    const result = await migrate(clientExecutor(admin), { schema });
    // Version 3, and every later one on top of it.
    expect(result).toMatchObject({
      from: 2,
      applied: Array.from({ length: LATEST_VERSION - 2 }, (_, i) => 3 + i),
    });
    const rows = await admin.query(
      `SELECT namespace, job, status, schedule_hash FROM ${quoted}.runs ORDER BY tick`,
    );
    expect(rows.rows).toEqual([
      { namespace: '', job: 'legacy', status: 'SUCCEEDED', schedule_hash: null },
      { namespace: '', job: 'legacy', status: 'FAILED', schedule_hash: null },
      { namespace: '', job: 'legacy', status: 'SUCCEEDED', schedule_hash: null },
    ]);
    const ran: string[] = [];
    const scheduler = createScheduler(createLockClient(clientExecutor(admin), { schema }), {
      now: () => BASE + 5010,
      catchUpGraceMs: 0,
    });
    scheduler.register('legacy', '* * * * * *', (run) => {
      ran.push(run.tick.toISOString());
    });
    await scheduler.runTick('legacy', new Date(at(2))); // already done before the upgrade
    await scheduler.runTick('legacy', new Date(at(5)));
    expect(ran).toEqual([at(5)]);
    const after = await admin.query(`SELECT tick, status FROM ${quoted}.runs ORDER BY tick`);
    expect(after.rows.map((r) => r.status)).toEqual([
      'SUCCEEDED',
      'FAILED',
      'SUCCEEDED',
      'MISSED',
      'MISSED',
      'SUCCEEDED',
    ]);
  });
});
