// postgres.js 3.4 starts every new connection with a query of its own, the array-type fetch
// (`fetch_types`, on by default), and drops its promise. When the connection was opened for a
// `sql.reserve()` — every lockkit call here reserves — postgres.js sets the reserve aside for that
// fetch, and a link that closes during it (a proxy's idle cut, a failover, a network blip) rejects
// the fetch's promise with nobody listening: an unhandled rejection, which ends a Node process by
// default. And the slot reconnects for the reserve, which postgres.js then forgets: the lockkit call
// never settles. Seen in `pnpm chaos --adapter postgres` (a worker's fresh pool cut by a fault):
// "unhandled rejection of Promise: Error: write CONNECTION_CLOSED".
//
// Lockkit's first call learns the pool's queues; after it, connections the pool opens run
// lockkit's throwaway first and make no fetch at all. Deterministic: the proxy cuts the link at the
// first statement of a new connection.
import { type RoundTripProxy, startRoundTripProxy } from '@lockkit/conformance';
import { createLockClient, type LockClient, LockKey } from '@lockkit/core';
import { testDatabaseUrl } from '@lockkit/test-db';
import postgres from 'postgres';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { postgresExecutor } from '../src/index.js';
import { startFrontProxy } from './front-proxy.js';

const TYPE_FETCH = /pg_catalog\.pg_type/;
const key = (label: string) => LockKey.fromNames('types-fetch', label);

let unhandled: unknown[] = [];
const onUnhandled = (error: unknown) => unhandled.push(error);
beforeEach(() => {
  unhandled = [];
  process.on('unhandledRejection', onUnhandled);
});
afterEach(() => {
  process.off('unhandledRejection', onUnhandled);
});

/** Settles `call` as 'ran' / the error's code, or 'hung' when it has not within `ms`. */
async function outcome(call: Promise<unknown>, ms: number): Promise<string> {
  let timer: NodeJS.Timeout | undefined;
  const hung = new Promise<string>((resolve) => {
    timer = setTimeout(() => resolve('hung'), ms);
  });
  try {
    return await Promise.race([
      call.then(
        () => 'ran',
        (error: { code?: string }) => `rejected ${error.code ?? String(error)}`,
      ),
      hung,
    ]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * With the application holding `held` (every open connection), a lockkit call opens a new one,
 * whose first statement — lockkit's throwaway, no array-type fetch — the proxy cuts: the call
 * settles (runs, or fails with the lost connection), the next call runs once `held` is released,
 * and nothing went unhandled.
 */
async function cutNewConnection(
  locks: LockClient<unknown, unknown>,
  proxy: RoundTripProxy,
  held: { release(): void }[],
): Promise<void> {
  const trap = proxy.trapStatement(0, 'drop-before');
  const call = locks.withLock(key('new'), async () => 'ran');
  expect((await trap.fired).text).toBe('SELECT 1');
  expect(['ran', 'rejected CONNECTION_LOST']).toContain(await outcome(call, 15_000));
  for (const h of held.splice(0)) h.release();
  expect(await locks.withLock(key('after'), async () => 2)).toEqual({ executed: true, result: 2 });
  await afterUnhandledReports();
  expect(unhandled).toEqual([]);
}

/** A rejection left unhandled is reported once the microtasks of its turn ran: one turn later. */
const afterUnhandledReports = () => new Promise((resolve) => setImmediate(resolve));

describe('a new connection cut during its array-type fetch', () => {
  for (const prepare of [true, false]) {
    it(`prepare ${prepare}: the first lockkit call of a fresh pool runs, and nothing goes unhandled`, async () => {
      const proxy = await startRoundTripProxy(testDatabaseUrl());
      const sql = postgres(proxy.url, { max: 2, prepare, onnotice: () => {} });
      try {
        const locks = createLockClient(postgresExecutor(sql as never), { engineSelfTest: false });
        const trap = proxy.trapStatement(0, 'drop-before');
        const call = locks.withLock(key('first'), async () => 'ran');
        expect((await trap.fired).text).toMatch(TYPE_FETCH);
        expect(await outcome(call, 15_000)).toBe('ran');
        // A rejection is reported a turn of the event loop after it was left unhandled.
        await afterUnhandledReports();
        expect(unhandled).toEqual([]);
      } finally {
        await sql.end({ timeout: 1 });
        await proxy.close();
      }
    }, 30_000);

    it(`prepare ${prepare}: a later connection makes no array-type fetch; cut at its first statement, the call settles, and nothing goes unhandled`, async () => {
      const proxy = await startRoundTripProxy(testDatabaseUrl());
      const sql = postgres(proxy.url, { max: 3, prepare, onnotice: () => {} });
      const held: { release(): void }[] = [];
      try {
        const locks = createLockClient(postgresExecutor(sql as never), { engineSelfTest: false });
        expect(await locks.withLock(key('warm'), async () => 1)).toEqual({
          executed: true,
          result: 1,
        });
        // The application holds the pool's open connection: the next call opens another.
        held.push(await sql.reserve());
        const wire = proxy.record();
        expect(await locks.withLock(key('second'), async () => 2)).toEqual({
          executed: true,
          result: 2,
        });
        expect(wire.stop().filter((s) => TYPE_FETCH.test(s.text))).toEqual([]);
        held.push(await sql.reserve());
        await cutNewConnection(locks, proxy, held);
      } finally {
        for (const h of held) h.release();
        await sql.end({ timeout: 1 });
        await proxy.close();
      }
    }, 30_000);

    it(`prepare ${prepare}: on a pool the application opened first, a call that opens a new connection cut at its first statement settles, and nothing goes unhandled`, async () => {
      const proxy = await startRoundTripProxy(testDatabaseUrl());
      const sql = postgres(proxy.url, { max: 3, prepare, onnotice: () => {} });
      const held: { release(): void }[] = [];
      try {
        // The application's own queries open connections before lockkit's first call.
        await Promise.all([sql`SELECT 1 AS one`, sql`SELECT 2 AS two`]);
        const locks = createLockClient(postgresExecutor(sql as never), { engineSelfTest: false });
        expect(await locks.withLock(key('warm'), async () => 1)).toEqual({
          executed: true,
          result: 1,
        });
        // The application holds every open connection: the next call opens a new one.
        held.push(await sql.reserve(), await sql.reserve());
        await cutNewConnection(locks, proxy, held);
      } finally {
        for (const h of held) h.release();
        await sql.end({ timeout: 1 });
        await proxy.close();
      }
    }, 30_000);

    it(`prepare ${prepare}: when lockkit's first query cannot connect, the call fails with it and the next one runs`, async () => {
      const proxy = await startRoundTripProxy(testDatabaseUrl());
      // In front of the proxy: the first TCP connection is reset as it is accepted.
      const front = await startFrontProxy(proxy.url, { resetFirst: true });
      const sql = postgres(front.url, { max: 2, prepare, onnotice: () => {} });
      try {
        const locks = createLockClient(postgresExecutor(sql as never), { engineSelfTest: false });
        const first = await outcome(
          locks.withLock(key('unreachable'), async () => 'ran'),
          15_000,
        );
        expect(first).toBe('rejected CONNECTION_LOST');
        const trap = proxy.trapStatement(0, 'drop-before');
        const call = locks.withLock(key('next'), async () => 'ran');
        expect((await trap.fired).text).toMatch(TYPE_FETCH);
        expect(await outcome(call, 15_000)).toBe('ran');
        await afterUnhandledReports();
        expect(unhandled).toEqual([]);
      } finally {
        await sql.end({ timeout: 1 });
        await front.close();
        await proxy.close();
      }
    }, 30_000);
  }
});
