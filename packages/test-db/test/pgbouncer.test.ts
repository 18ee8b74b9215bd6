/**
 * What PgBouncer really does, in both pool modes — the premises of lockkit's pooler detection:
 * the backend pid a client is told at connect (BackendKeyData) is PgBouncer's invention in both
 * modes, so it cannot tell them apart; what differs is whether one client's statements stay on
 * one server backend that no other client can reach.
 */
import { testDatabaseBaseUrl } from '@lockkit/test-db';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { findPgBouncer, type PgBouncer, startPgBouncer } from '../src/pgbouncer.js';

const installed = findPgBouncer() !== undefined;
let bouncer: PgBouncer;
const clients: pg.Client[] = [];

beforeAll(async () => {
  if (installed) bouncer = await startPgBouncer(testDatabaseBaseUrl());
});
afterAll(async () => {
  await Promise.all(clients.map((c) => c.end().catch(() => {})));
  await bouncer?.stop();
});

async function client(url: string): Promise<pg.Client & { processID: number }> {
  const c = new pg.Client({ connectionString: url });
  c.on('error', () => {});
  await c.connect();
  clients.push(c);
  return c as pg.Client & { processID: number };
}
const pidOf = async (c: pg.Client) =>
  Number((await c.query('SELECT pg_backend_pid() AS pid')).rows[0].pid);

describe.skipIf(!installed)(
  `PgBouncer's pool modes${installed ? '' : ' — skipped: pgbouncer is not installed'}`,
  () => {
    it('gives every client an invented backend pid at connect, in both modes', async () => {
      for (const url of [bouncer.url, bouncer.sessionModeUrl]) {
        // Random 32 bits (PgBouncer ≥ 1.22 clears the sign bit; Debian's 1.18 does not).
        const c = await client(url);
        expect(Number.isInteger(c.processID)).toBe(true);
        expect(await pidOf(c)).not.toBe(c.processID);
      }
    });

    it('session mode: a client keeps its backend, and no other client reaches it', async () => {
      const a = await client(bouncer.sessionModeUrl);
      const first = await pidOf(a);
      for (let i = 0; i < 5; i++) {
        const b = await client(bouncer.sessionModeUrl);
        expect(await pidOf(b)).not.toBe(first);
        expect(await pidOf(a)).toBe(first);
      }
    });

    it('transaction mode: the next client gets the backend an idle client just used', async () => {
      const a = await client(bouncer.url);
      const b = await client(bouncer.url);
      const used = await pidOf(a);
      expect(await pidOf(b)).toBe(used);
    });

    it('session mode resets a server before the next client: a left-over session lock is gone', async () => {
      const a = await client(bouncer.sessionModeUrl);
      const pid = await pidOf(a);
      await a.query('SELECT pg_advisory_lock(42, 4242)');
      await a.end();
      const observer = await client(testDatabaseBaseUrl());
      for (let i = 0; ; i++) {
        const { rows } = await observer.query(
          "SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND pid = $1 AND objid = 4242",
          [pid],
        );
        if (rows[0].n === 0) break;
        expect(i, 'the lock outlived its client').toBeLessThan(100);
        await new Promise((r) => setTimeout(r, 20));
      }
    });
  },
);
