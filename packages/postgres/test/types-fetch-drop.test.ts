// postgres.js 3.4 starts every new connection with a query of its own, the array-type fetch
// (`fetch_types`, on by default). When the connection was opened for a `sql.reserve()` — every
// lockkit call here reserves — postgres.js sets the reserve aside for that fetch, and a link that
// closes during it (a proxy's idle cut, a failover, a network blip) rejects the fetch's promise,
// which nothing handles: an unhandled rejection, which ends a Node process by default. And the
// slot reconnects for the reserve, which postgres.js then forgets: the lockkit call never settles.
// Seen in `pnpm chaos --adapter postgres` (a worker's pool, fresh after a kill, cut by a drop
// fault): "unhandled rejection of Promise: Error: write CONNECTION_CLOSED".
//
// Deterministic: the proxy cuts the link at the fetch itself (the first statement on the wire).
import { startRoundTripProxy } from '@lockkit/conformance';
import { createLockClient, LockKey } from '@lockkit/core';
import { testDatabaseUrl } from '@lockkit/test-db';
import postgres from 'postgres';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { postgresExecutor } from '../src/index.js';

const TYPE_FETCH = /pg_catalog\.pg_type/;

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

describe('a new connection cut during its array-type fetch', () => {
  for (const prepare of [true, false]) {
    it(`prepare ${prepare}: the first lockkit call of a fresh pool runs, and nothing goes unhandled`, async () => {
      const proxy = await startRoundTripProxy(testDatabaseUrl());
      const sql = postgres(proxy.url, { max: 2, prepare, onnotice: () => {} });
      try {
        const locks = createLockClient(postgresExecutor(sql as never), { engineSelfTest: false });
        const trap = proxy.trapStatement(0, 'drop-before');
        const call = locks.withLock(LockKey.fromNames('types-fetch', 'first'), async () => 'ran');
        expect((await trap.fired).text).toMatch(TYPE_FETCH);
        expect(await outcome(call, 15_000)).toBe('ran');
        // A rejection is reported a turn of the event loop after it was left unhandled.
        await new Promise((resolve) => setTimeout(resolve, 50));
        expect(unhandled).toEqual([]);
      } finally {
        await sql.end({ timeout: 1 });
        await proxy.close();
      }
    }, 30_000);

    it(`prepare ${prepare}: a later call that opens a new connection runs when it is cut, and nothing goes unhandled`, async () => {
      const proxy = await startRoundTripProxy(testDatabaseUrl());
      const sql = postgres(proxy.url, { max: 2, prepare, onnotice: () => {} });
      try {
        const locks = createLockClient(postgresExecutor(sql as never), { engineSelfTest: false });
        expect(
          await locks.withLock(LockKey.fromNames('types-fetch', 'warm'), async () => 1),
        ).toEqual({ executed: true, result: 1 });
        // The application holds the pool's one open connection: the next call opens the other.
        const held = await sql.reserve();
        const trap = proxy.trapStatement(0, 'drop-before');
        const call = locks.withLock(LockKey.fromNames('types-fetch', 'second'), async () => 'ran');
        expect((await trap.fired).text).toMatch(TYPE_FETCH);
        expect(await outcome(call, 15_000)).toBe('ran');
        held.release();
        await new Promise((resolve) => setTimeout(resolve, 50));
        expect(unhandled).toEqual([]);
      } finally {
        await sql.end({ timeout: 1 });
        await proxy.close();
      }
    }, 30_000);
  }
});
