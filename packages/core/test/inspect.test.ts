/**
 * inspect() against a real server: a held lock decoded to its names with its holder and waiter,
 * leases and ledger read back, lock-table capacity.
 */
import { randomBytes } from 'node:crypto';
import { testDatabaseBaseUrl, testDatabaseUrl } from '@lockkit/test-db';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { LockkitError } from '../src/errors.js';
import type { LockExecutor } from '../src/executor.js';
import { type InspectOptions, inspect, KeyNames, sampleLocks } from '../src/inspect.js';
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

describe('sampleLocks()', () => {
  it('sees a held lock, its holder and its application, in one cheap statement', async () => {
    const key = LockKey.fromNames('reports', `sampled-${randomBytes(3).toString('hex')}`);
    const [k1, k2] = key.pair as readonly [number, number];
    const holderPid = Number((await holder.query('SELECT pg_backend_pid() AS pid')).rows[0].pid);
    await holder.query('SELECT pg_advisory_lock($1::int4, $2::int4)', [k1, k2]);
    try {
      const names = new KeyNames().add('reports', key.names?.jobKey as string);
      const sample = await sampleLocks(clientExecutor(reader), { names });
      expect(sample.locks.filter((l) => l.key.equals(key))).toEqual([
        expect.objectContaining({
          pid: holderPid,
          granted: true,
          mode: 'exclusive',
          applicationName: 'inspect-0',
          names: key.names,
        }),
      ]);
      await expect(sampleLocks(clientExecutor(reader), { names: {} as KeyNames })).rejects.toThrow(
        /names must be a KeyNames/,
      );
    } finally {
      await holder.query('SELECT pg_advisory_unlock_all()');
    }
  });
});

describe('inspect() options', () => {
  it('rejects bad options with a typed error before any SQL', async () => {
    let sent = 0;
    const executor: LockExecutor = {
      name: 'counting',
      transaction: async () => {
        sent++;
        throw new Error('no SQL should be sent');
      },
    };
    const bad: [InspectOptions, RegExp][] = [
      [{ recentRuns: -1 }, /recentRuns/],
      [{ recentRuns: 'x' as unknown as number }, /recentRuns/],
      [{ recentRuns: 1.5 }, /recentRuns/],
      [{ recentRuns: 1e9 }, /recentRuns/],
      [{ runsPerJob: -3 }, /runsPerJob/],
      [{ jobWindow: 0 }, /jobWindow/],
      [{ warnAbove: 2 }, /warnAbove/],
      [{ warnAbove: Number.NaN }, /warnAbove/],
      [{ names: {} as KeyNames }, /names/],
      [{ schema: 'x; DROP TABLE y' }, /schema/],
    ];
    for (const [options, message] of bad) {
      const error = await inspect(executor, options).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(error, JSON.stringify(options)).toBeInstanceOf(LockkitError);
      expect((error as LockkitError).code).toBe('OPTION_INVALID');
      expect((error as LockkitError).message).toMatch(message);
    }
    expect(sent).toBe(0);
  });
});

describe('inspect() on a long ledger', () => {
  it('reads a bounded number of ledger rows, however many the ledger holds', async () => {
    const ledger = `${schema}_long`;
    await createLockClient(clientExecutor(reader), { schema: ledger }).migrate();
    try {
      // Two per-second jobs, 20,000 ticks each: a few hours of history.
      await reader.query(
        `INSERT INTO "${ledger}".runs (job, tick, status, owner)
         SELECT 'job-' || j, now() - make_interval(secs => s),
                CASE WHEN s % 10 = 0 THEN 'MISSED' ELSE 'SUCCEEDED' END, 'w1'
           FROM generate_series(1, 2) j, generate_series(0, 19999) s`,
      );
      await reader.query(`ANALYZE "${ledger}".runs`);
      const statements: { text: string; params: readonly unknown[] | undefined }[] = [];
      const executor = clientExecutor(reader);
      const seen = await inspect(
        {
          ...executor,
          transaction: (fn) =>
            executor.transaction((ctx) =>
              fn({
                ...ctx,
                query: (text, params) => {
                  statements.push({ text, params });
                  return ctx.query(text, params);
                },
              }),
            ),
        },
        { schema: ledger },
      );
      expect(seen.jobs.map((j) => j.job)).toEqual(['job-1', 'job-2']);
      expect(seen.recentRuns).toHaveLength(50);
      // Every statement that touches the ledger, run again under EXPLAIN ANALYZE: the rows it
      // pulled out of the runs table (all loops) stay bounded by jobs × window, not the ledger.
      let ledgerRows = 0;
      const walk = (node: Record<string, unknown>) => {
        if (node['Relation Name'] === 'runs' || node['Index Name'] === 'runs_pkey') {
          ledgerRows += Number(node['Actual Rows']) * Number(node['Actual Loops']);
        }
        for (const child of (node.Plans as Record<string, unknown>[] | undefined) ?? [])
          walk(child);
      };
      for (const s of statements.filter((s) => s.text.includes('.runs'))) {
        const { rows } = await reader.query(
          `EXPLAIN (ANALYZE, FORMAT JSON) ${s.text}`,
          s.params ? [...s.params] : undefined,
        );
        walk((rows[0]['QUERY PLAN'] as { Plan: Record<string, unknown> }[])[0]?.Plan ?? {});
      }
      expect(ledgerRows).toBeGreaterThan(0);
      expect(ledgerRows).toBeLessThan(10_000); // the ledger holds 40,000
    } finally {
      await reader.query(`DROP SCHEMA IF EXISTS "${ledger}" CASCADE`);
    }
  });
});
