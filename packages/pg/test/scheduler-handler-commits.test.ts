/**
 * A transaction-mode scheduler handler that ends the tick's transaction itself (its own COMMIT):
 * its work and the tick's claim committed there, and the job's lock went with them. The scheduler
 * must tell that truth — `LOCK_NOT_HELD`, as withLock does for the same misuse (docs/errors.md) —
 * not `COMMIT_ROLLED_BACK` ("none of its work can commit"), and must not leave the tick RUNNING
 * for good with no runner: it is recorded FAILED with that error (its work may be committed, so it
 * is not retried). Found by an outside review (attack2).
 */
import { randomBytes } from 'node:crypto';
import { createScheduler } from '@lockkit/core';
import { createLockKit } from '@lockkit/pg';
import { testDatabaseUrl } from '@lockkit/test-db';
import pg from 'pg';
import { expect, it } from 'vitest';

const BASE = Date.UTC(2031, 0, 1, 0, 0, 0);

it('a handler that COMMITs the tick transaction itself: error LOCK_NOT_HELD, the tick recorded FAILED, its work kept', async () => {
  const schema = `attack_hc_${randomBytes(4).toString('hex')}`;
  const pool = new pg.Pool({ connectionString: testDatabaseUrl(), max: 3 });
  const admin = new pg.Client({ connectionString: testDatabaseUrl() });
  await admin.connect();
  try {
    const locks = createLockKit(pool, { schema });
    await locks.migrate();
    await admin.query(`CREATE TABLE "${schema}".work (tick timestamptz)`);
    const events: string[] = [];
    const s = createScheduler(locks, { namespace: schema, now: () => BASE + 10 });
    for (const type of ['ran', 'failed', 'error', 'skipped-done'] as const)
      s.on(type, (e: unknown) => {
        const code = (e as { error?: { code?: string } }).error?.code;
        events.push(`${type}:${code ?? ''}`);
      });
    s.register('job', '* * * * * *', async (run) => {
      await run.query(`INSERT INTO "${schema}".work VALUES ($1)`, [run.tick]);
      await run.query('COMMIT');
    });
    await s.runTick('job', new Date(BASE));
    // A late node fires the same tick (its clock behind), and then the next tick fires.
    await s.runTick('job', new Date(BASE));
    const work = (await admin.query(`SELECT count(*)::int AS n FROM "${schema}".work`)).rows[0].n;
    const ledger = (await admin.query(`SELECT status, error FROM "${schema}".runs`)).rows;
    const held = (
      await admin.query(`SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory'
        AND pid IN (SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid())`)
    ).rows[0].n;
    await s.stop();
    // The handler's INSERT committed (its own COMMIT), once: the late firing finds the tick done.
    expect(work).toBe(1);
    expect(events).toEqual(['error:LOCK_NOT_HELD', 'skipped-done:']);
    expect(ledger.map((r) => r.status)).toEqual(['FAILED']);
    expect(String(ledger[0]?.error)).toContain('LockNotHeldError');
    expect(held).toBe(0);
  } finally {
    await admin.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
    await admin.end();
    await pool.end();
  }
});
