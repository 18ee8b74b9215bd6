/**
 * A Kysely whose plugins rewrite results (`CamelCasePlugin`, the most common one) must not change
 * what lockkit reads: core's statements answer in snake_case columns (`runner_gone`, `in_recovery`,
 * `pair_seen`, …), and a renamed column reads as missing — the engine self-test then refused every
 * call, and with it turned off a lease-mode tick whose runner died was never run again. The task's
 * own handles keep the user's plugins.
 */
import { randomBytes } from 'node:crypto';
import { LockKey } from '@lockkit/core';
import { testDatabaseUrl } from '@lockkit/test-db';
import { CamelCasePlugin, Kysely, PostgresDialect, sql } from 'kysely';
import pg from 'pg';
import { afterEach, describe, expect, it } from 'vitest';
import { createLockKit } from '../src/index.js';
import type { TestDatabase } from './instances.js';

const closers: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  await Promise.all(closers.splice(0).map((close) => close()));
});

/** A Kysely made as many applications make it: snake_case columns read as camelCase. */
function camelCaseDb() {
  const pool = new pg.Pool({ connectionString: testDatabaseUrl(), max: 4 });
  pool.on('error', () => {});
  const db = new Kysely<TestDatabase>({
    dialect: new PostgresDialect({ pool }),
    plugins: [new CamelCasePlugin()],
  });
  closers.push(() => db.destroy());
  return { db, pool };
}

const key = () => LockKey.fromNames('kysely-plugins', randomBytes(6).toString('hex'));

describe('@lockkit/kysely under a result-transforming plugin', () => {
  it.each([
    ['with the pool option', true],
    ['without it', false],
  ])(
    'transaction scope, %s: the self-test passes, ctx.query reads server columns, trx keeps the plugin',
    async (_label, givePool) => {
      const { db, pool } = camelCaseDb();
      if (!givePool) pool.on('connect', (client) => client.on('error', () => {}));
      const locks = createLockKit(db, givePool ? { pool } : {});
      const r = await locks.withLock(key(), async (trx, ctx) => {
        const [core] = await ctx.query('SELECT true AS runner_gone');
        const own = await sql<{ someValue: number }>`SELECT 1 AS some_value`.execute(trx);
        return { core, own: own.rows[0] };
      });
      expect(r).toEqual({
        executed: true,
        result: { core: { runner_gone: true }, own: { someValue: 1 } },
      });
    },
  );

  it('session scope: ctx.query reads server columns, the pinned Kysely keeps the plugin', async () => {
    const { db, pool } = camelCaseDb();
    const locks = createLockKit(db, { pool });
    const r = await locks.withSessionLock(key(), async (session, ctx) => {
      const [core] = await ctx.query('SELECT true AS in_recovery');
      const own = await sql<{ someValue: number }>`SELECT 2 AS some_value`.execute(session);
      return { core, own: own.rows[0] };
    });
    expect(r).toEqual({
      executed: true,
      result: { core: { in_recovery: true }, own: { someValue: 2 } },
    });
  });
});
