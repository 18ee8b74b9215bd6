/**
 * inspect() against a real server: a held lock decoded to its names with its holder and waiter,
 * leases and ledger read back, lock-table capacity.
 */
import { randomBytes } from 'node:crypto';
import { testDatabaseBaseUrl, testDatabaseUrl } from '@lockkit/test-db';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { inspect, KeyNames } from '../src/inspect.js';
import { LockKey } from '../src/keys.js';
import { createLockClient } from '../src/lock.js';
import { clientExecutor } from './client-executor.js';

let holder: pg.Client;
let waiter: pg.Client;
let reader: pg.Client;
const schema = `lockkit_inspect_${randomBytes(4).toString('hex')}`;

beforeAll(async () => {
  [holder, waiter, reader] = [0, 1, 2].map(
    (i) =>
      new pg.Client({ connectionString: testDatabaseBaseUrl(), application_name: `inspect-${i}` }),
  ) as [pg.Client, pg.Client, pg.Client];
  for (const c of [holder, waiter, reader]) c.on('error', () => {});
  await Promise.all([holder.connect(), waiter.connect(), reader.connect()]);
});
afterAll(async () => {
  await reader.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
  await Promise.all([holder.end(), waiter.end(), reader.end()]);
});

describe('inspect()', () => {
  it('decodes a held lock and its waiter, and reports capacity', async () => {
    const key = LockKey.fromNames('reports', `daily-${randomBytes(3).toString('hex')}`);
    const [k1, k2] = key.pair as readonly [number, number];
    const { rows } = await holder.query('SELECT pg_backend_pid() AS pid');
    const holderPid = rows[0].pid as number;
    await holder.query('SELECT pg_advisory_lock($1::int4, $2::int4)', [k1, k2]);
    const waiting = waiter.query('SELECT pg_advisory_lock($1::int4, $2::int4)', [k1, k2]);
    await new Promise((r) => setTimeout(r, 200));
    try {
      const names = new KeyNames().add('reports', key.names?.jobKey as string);
      const seen = await inspect(clientExecutor(reader), { names, schema });
      const ours = seen.locks.filter((l) => l.key.equals(key));
      expect(ours).toHaveLength(2);
      const held = ours.find((l) => l.granted);
      const wait = ours.find((l) => !l.granted);
      expect(held).toMatchObject({
        pid: holderPid,
        mode: 'exclusive',
        applicationName: 'inspect-0',
        names: key.names,
      });
      expect(wait?.blockedBy).toEqual([holderPid]);
      expect(wait?.waitingMs).toBeGreaterThan(0);
      expect(seen.capacity.slots).toBeGreaterThan(0);
      expect(seen.capacity.advisory).toBeGreaterThanOrEqual(2);
      expect(seen.leases).toEqual([]); // no tables yet: empty, not an error
    } finally {
      await holder.query('SELECT pg_advisory_unlock_all()');
      await waiting;
      await waiter.query('SELECT pg_advisory_unlock_all()');
    }
  });

  it('reads leases and decodes a lease-held key on its own', async () => {
    const locks = createLockClient(clientExecutor(reader), { schema });
    await locks.migrate();
    const other = new pg.Client({ connectionString: testDatabaseUrl() });
    await other.connect();
    try {
      const r = await createLockClient(clientExecutor(other), { schema }).runWithLease(
        'exports',
        'monthly',
        async (lease) => {
          const seen = await inspect(clientExecutor(reader), { schema });
          return { seen, token: lease.token };
        },
        { heartbeat: false, ttlMs: 5000 },
      );
      expect(r.executed).toBe(true);
      if (!r.executed) return;
      expect(r.result.seen.leases).toEqual([
        expect.objectContaining({
          namespace: 'exports',
          jobKey: 'monthly',
          held: true,
          status: 'IN_PROGRESS',
          token: r.result.token,
        }),
      ]);
    } finally {
      await other.end();
    }
  });
});
