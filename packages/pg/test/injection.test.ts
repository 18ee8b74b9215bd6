/**
 * SQL-injection payloads as job names, namespaces, owners and error messages: each is stored
 * verbatim where lockkit stores it, and nothing else in the database changes (a canary table and
 * lockkit's other rows stay as they were). Schema names are validated, never interpolated raw.
 */
import { randomBytes } from 'node:crypto';
import { createScheduler, LockKey, LockkitError } from '@lockkit/core';
import { testDatabaseUrl } from '@lockkit/test-db';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLockKit } from '../src/index.js';

const suffix = randomBytes(4).toString('hex');
const schema = `lockkit_inject_${suffix}`;
const canary = `lockkit_canary_${suffix}`;

const PAYLOADS = [
  `'; DROP TABLE ${canary}; --`,
  `x'); DELETE FROM ${schema}.leases; --`,
  `"; UPDATE ${canary} SET v = 'pwned'; --`,
  `$1; SELECT pg_terminate_backend(pg_backend_pid()); --`,
  `\\'; TRUNCATE ${canary}; --`,
  `$$; DROP SCHEMA ${schema} CASCADE; $$`,
  `' OR '1'='1`,
  `Robert'); DROP TABLE Students;--`,
  `E'\\x27; DROP TABLE ${canary}`,
  `/* */ ; COMMIT; DROP TABLE ${canary}; BEGIN; --`,
];

let pool: pg.Pool;
beforeAll(async () => {
  pool = new pg.Pool({ connectionString: testDatabaseUrl(), max: 4 });
  await pool.query(`CREATE TABLE ${canary} (v text)`);
  await pool.query(`INSERT INTO ${canary} VALUES ('intact')`);
  await createLockKit(pool, { schema }).migrate();
});
afterAll(async () => {
  await pool.query(`DROP TABLE IF EXISTS ${canary}`);
  await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
  await pool.end();
});

const canaryIntact = async () => {
  const { rows } = await pool.query(`SELECT v FROM ${canary}`);
  expect(rows).toEqual([{ v: 'intact' }]);
};

describe('SQL-injection payloads are data, never SQL', () => {
  it('as namespaces and job keys of locks and leases, as owners and as error messages', async () => {
    const locks = createLockKit(pool, { schema });
    for (const payload of PAYLOADS) {
      const r = await locks.runExclusiveJob(payload, payload, async (client) => {
        const { rows } = await client.query('SELECT 1 AS ok');
        return rows[0].ok as number;
      });
      expect(r).toEqual({ executed: true, result: 1 });

      // A lease under the payload's names, owned by the payload, failing with it as message.
      await expect(
        locks.runWithLease(
          payload,
          `${payload}-job`,
          async (lease) => {
            await lease.fenced((client) => client.query('SELECT 1'));
            throw new Error(payload);
          },
          { owner: payload, ttlMs: 10_000 },
        ),
      ).rejects.toThrow(payload);
      const { rows } = await pool.query(
        `SELECT namespace, job_key, owner, status, last_error FROM "${schema}".leases
          WHERE namespace = $1 AND job_key = $2`,
        [payload, `${payload}-job`],
      );
      expect(rows).toEqual([
        {
          namespace: payload,
          job_key: `${payload}-job`,
          owner: payload,
          status: 'FAILED',
          last_error: expect.stringContaining(payload),
        },
      ]);
    }
    const { rows } = await pool.query(`SELECT count(*)::int AS n FROM "${schema}".leases`);
    expect(rows[0].n).toBe(PAYLOADS.length); // one row per payload, nothing deleted
    await canaryIntact();
  });

  it('as scheduled job names, scheduler owners and failure messages in the ledger', async () => {
    const locks = createLockKit(pool, { schema });
    for (const payload of PAYLOADS.slice(0, 4)) {
      const scheduler = createScheduler(locks, { owner: payload });
      const ran = new Promise<void>((resolve) => {
        scheduler.register(payload, '* * * * * *', () => {
          resolve();
          throw new Error(payload);
        });
      });
      const failed = new Promise((resolve) => scheduler.on('failed', resolve));
      await scheduler.start();
      await ran;
      await failed;
      await scheduler.stop({ timeoutMs: 5000 });
      const { rows } = await pool.query(
        `SELECT job, owner, status, error FROM "${schema}".runs WHERE job = $1`,
        [payload],
      );
      expect(rows.length).toBeGreaterThanOrEqual(1);
      expect(rows[0]).toMatchObject({ job: payload, owner: payload, status: 'FAILED' });
      expect(rows[0].error).toContain(payload);
    }
    await canaryIntact();
  });

  it('as schema names: refused before any SQL, with a typed error', async () => {
    for (const payload of PAYLOADS) {
      expect(() => createLockKit(pool, { schema: payload })).toThrow(LockkitError);
    }
    // A valid but odd schema name is quoted, not interpolated raw.
    const odd = `Odd_${suffix}`;
    await createLockKit(pool, { schema: odd }).migrate();
    const { rows } = await pool.query(
      'SELECT count(*)::int AS n FROM information_schema.tables WHERE table_schema = $1',
      [odd],
    );
    expect(rows[0].n).toBeGreaterThan(0);
    await pool.query(`DROP SCHEMA "${odd}" CASCADE`);
    await canaryIntact();
  });

  it('hashes payload names to keys like any other name', () => {
    for (const payload of PAYLOADS) {
      const key = LockKey.fromNames(payload, payload);
      expect(key.names).toEqual({ namespace: payload, jobKey: payload });
    }
  });
});
