/**
 * The pg_locks coordinates of LockKey, checked against a real server: take each lock, read
 * pg_locks from a second connection, compare, and map the row back to the key.
 */
import { leakedAdvisoryLocks, type SeenLock, testDatabaseUrl } from '@lockkit/test-db';
import fc from 'fast-check';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { LockKey } from '../src/keys.js';
import vectors from './fixtures/lock-keys.json' with { type: 'json' };

let holder: pg.Client;
let observer: pg.Client;

beforeAll(async () => {
  holder = new pg.Client({ connectionString: testDatabaseUrl() });
  observer = new pg.Client({ connectionString: testDatabaseUrl(), application_name: 'observer' });
  await Promise.all([holder.connect(), observer.connect()]);
});

afterAll(async () => {
  await Promise.all([holder.end(), observer.end()]);
});

interface LockRow {
  locktype: string;
  classid: string;
  objid: string;
  objsubid: number;
  mode: string;
  granted: boolean;
}

async function advisoryLocksOf(pid: number): Promise<LockRow[]> {
  const { rows } = await observer.query<LockRow>(
    `SELECT locktype, classid::text, objid::text, objsubid::int AS objsubid, mode, granted
       FROM pg_locks WHERE locktype = 'advisory' AND pid = $1`,
    [pid],
  );
  return rows;
}

async function holderPid(): Promise<number> {
  const { rows } = await holder.query<{ pid: number }>('SELECT pg_backend_pid() AS pid');
  return (rows[0] as { pid: number }).pid;
}

async function seenWhileHeld(key: LockKey): Promise<LockRow[]> {
  const pid = await holderPid();
  if (key.pair) {
    await holder.query('SELECT pg_advisory_lock($1::int4, $2::int4)', [key.pair[0], key.pair[1]]);
  } else {
    await holder.query('SELECT pg_advisory_lock($1::int8)', [String(key.int8)]);
  }
  try {
    return await advisoryLocksOf(pid);
  } finally {
    await holder.query('SELECT pg_advisory_unlock_all()');
  }
}

describe('pg_locks coordinates on a real server', () => {
  it.each(vectors.cases.map((c) => [c.jobKey, c] as const))(
    'vector %s appears where the fixture says',
    async (_label, c) => {
      const key = LockKey.fromNames(c.namespace, c.jobKey);
      const rows = await seenWhileHeld(key);
      expect(rows).toHaveLength(1);
      const row = rows[0] as LockRow;
      expect({
        classid: Number(row.classid),
        objid: Number(row.objid),
        objsubid: row.objsubid,
      }).toEqual(c.pg_locks);
      expect(row).toMatchObject({ mode: 'ExclusiveLock', granted: true });
      expect(LockKey.fromPgLocks(row).equals(key)).toBe(true);
    },
  );

  it('maps random int4 pairs and int8 keys both ways', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.oneof(
          fc.tuple(fc.integer(), fc.integer()).map(([a, b]) => LockKey.fromPair(a, b)),
          fc.bigInt({ min: -(2n ** 63n), max: 2n ** 63n - 1n }).map((n) => LockKey.fromBigInt(n)),
          fc.constantFrom(
            LockKey.fromBigInt(-1n),
            LockKey.fromBigInt(2n ** 63n - 1n),
            LockKey.fromBigInt(-(2n ** 63n)),
            LockKey.fromPair(-1, -(2 ** 31)),
          ),
        ),
        async (key) => {
          const rows = await seenWhileHeld(key);
          expect(rows).toHaveLength(1);
          const row = rows[0] as LockRow;
          expect({
            classid: Number(row.classid),
            objid: Number(row.objid),
            objsubid: row.objsubid,
          }).toEqual(key.pgLocks);
          const back = LockKey.fromPgLocks(row);
          expect(back.equals(key)).toBe(true);
          expect(back.kind).toBe(key.kind);
        },
      ),
      { numRuns: 60 },
    );
  });

  it('an int8 key and the pair with the same coordinates are different locks', async () => {
    const int8 = LockKey.fromBigInt(123_456_789_012n);
    const { classid, objid } = int8.pgLocks;
    const pair = LockKey.fromPair(classid | 0, objid | 0);
    await holder.query('SELECT pg_advisory_lock($1::int8)', [String(int8.int8)]);
    try {
      const { rows } = await observer.query<{ ok: boolean }>(
        'SELECT pg_try_advisory_xact_lock($1::int4, $2::int4) AS ok',
        [pair.pair?.[0], pair.pair?.[1]],
      );
      expect(rows[0]?.ok).toBe(true);
    } finally {
      await holder.query('SELECT pg_advisory_unlock_all()');
    }
  });
});

describe('the after-each leak check', () => {
  it('sees a lock held by a tagged connection, and not after it is released', async () => {
    const key = LockKey.fromPair(7, Math.floor(Math.random() * 1e9));
    await holder.query('SELECT pg_advisory_lock($1::int4, $2::int4)', [
      key.pair?.[0],
      key.pair?.[1],
    ]);
    const seen = await leakedAdvisoryLocks();
    await holder.query('SELECT pg_advisory_unlock_all()');
    expect(seen).toHaveLength(1);
    expect(LockKey.fromPgLocks(seen[0] as SeenLock).equals(key)).toBe(true);
    expect(await leakedAdvisoryLocks()).toEqual([]);
  });
});
