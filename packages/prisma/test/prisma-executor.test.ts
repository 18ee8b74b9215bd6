/**
 * Prisma specifics: the interactive transaction's timeout becomes a typed error naming the option
 * (and the lock is released), per-call limits, no session scope, and the task's writes through
 * Prisma's own `tx` joining the lock's transaction.
 */
import {
  isLockkitError,
  LockKey,
  TransactionExpiredError,
  UnsupportedCapabilityError,
} from '@lockkit/core';
import { testDatabaseUrl } from '@lockkit/test-db';
import { startHeldGoodbyeProxy } from '@lockkit/test-db/held-goodbye-proxy';
import pg from 'pg';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { prismaExecutor } from '../src/index.js';
import { prismaInstance } from './instances.js';

let admin: pg.Client;
const instances: { close(): Promise<void> }[] = [];
beforeAll(async () => {
  admin = new pg.Client({ connectionString: testDatabaseUrl() });
  await admin.connect();
  await admin.query(
    'CREATE TABLE IF NOT EXISTS lockkit_prisma_invoices (id serial PRIMARY KEY, number text NOT NULL, issued boolean NOT NULL DEFAULT false)',
  );
});
afterAll(async () => {
  await admin.query('DROP TABLE IF EXISTS lockkit_prisma_invoices');
  await admin.end();
});
afterEach(async () => {
  await Promise.all(instances.splice(0).map((i) => i.close()));
});
const make = (
  ...args: Parameters<typeof prismaInstance> extends [string, number, ...infer R] ? R : never
) => {
  const i = prismaInstance(testDatabaseUrl(), 4, ...args);
  instances.push(i);
  return i;
};
const held = async (key: LockKey) =>
  (
    await admin.query(
      `SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND classid = $1::int8::oid AND objid = $2::int8::oid`,
      [key.pgLocks.classid, key.pgLocks.objid],
    )
  ).rows[0].n as number;

describe('@lockkit/prisma', () => {
  it("turns Prisma's expired interactive transaction into TransactionExpiredError naming `timeout`, and the lock is released", async () => {
    const i = make();
    const locks = i.locks({ timeout: 400 });
    const key = LockKey.fromNames('prisma-test', `expiry-${Math.random()}`);
    let signalled: unknown;
    const started = Date.now();
    const error = await locks
      .withLock(key, async (_tx, ctx) => {
        expect(await held(key)).toBe(1);
        await new Promise<void>((resolve) => ctx.signal.addEventListener('abort', () => resolve()));
        signalled = ctx.signal.reason;
        return 'too late';
      })
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(TransactionExpiredError);
    expect((error as TransactionExpiredError).option).toBe('timeout');
    expect((error as Error).message).toMatch(/timeout option/);
    expect(signalled).toBeInstanceOf(TransactionExpiredError);
    expect(Date.now() - started).toBeGreaterThanOrEqual(350);
    expect(await held(key)).toBe(0);
    // A per-call limit: the same work under a longer timeout completes.
    const r = await locks.withTransactionOptions({ timeout: 5000 }).withLock(key, async () => {
      await new Promise((resolve) => setTimeout(resolve, 600));
      return 'in time';
    });
    expect(r).toEqual({ executed: true, result: 'in time' });
  });

  it('has no session scope: session calls fail at once with a typed error naming Prisma', async () => {
    const locks = make().locks();
    expect(locks.executor.session).toBeUndefined();
    const error = await locks
      .withSessionLock(LockKey.fromPair(5, 5), async () => 1)
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(UnsupportedCapabilityError);
    expect((error as UnsupportedCapabilityError).adapter).toBe('prisma');
    expect((error as Error).message).toMatch(/lease/);
  });

  it('refuses a transaction client (the tx of $transaction) in place of the PrismaClient at creation, saying what to pass', async () => {
    const i = make();
    const seen = await i.prisma.$transaction(async (tx) => {
      try {
        prismaExecutor(tx as unknown as Parameters<typeof prismaExecutor>[0]);
        return { code: 'accepted', message: '' };
      } catch (error) {
        return {
          code: isLockkitError(error) ? error.code : String(error),
          message: (error as Error).message,
        };
      }
    });
    expect(seen.code).toBe('OPTION_INVALID');
    expect(seen.message).toMatch(/transaction client/);
    expect(seen.message).toMatch(/PrismaClient/);
  });

  it("gives the task Prisma's own tx: model writes commit with the lock and roll back with it", async () => {
    const locks = make().locks();
    const number = `INV-${Math.random()}`;
    await locks.runExclusiveJob('prisma-test', 'invoices', async (tx) => {
      await tx.invoice.create({ data: { number } });
    });
    await locks
      .runExclusiveJob('prisma-test', 'invoices', async (tx) => {
        await tx.invoice.create({ data: { number: `${number}-rolled-back` } });
        throw new Error('undo');
      })
      .catch(() => {});
    const { rows } = await admin.query(
      'SELECT number FROM lockkit_prisma_invoices WHERE number LIKE $1',
      [`${number}%`],
    );
    expect(rows).toEqual([{ number }]);
  });
  it('runs the next call on a fresh connection when the pooled one lost its backend a moment ago, before the pool saw it close', async () => {
    // The pool of one holds a connection whose backend is terminated while the proxy holds back
    // the server's FATAL and hang-up: the pool lends it as live, its BEGIN goes nowhere, and only
    // then does the client hear. Nothing of the call had reached the server, so it starts again.
    const proxy = await startHeldGoodbyeProxy(testDatabaseUrl());
    instances.push(proxy);
    const i = prismaInstance(proxy.url, 1);
    instances.push(i);
    const locks = i.locks();
    const backend = async (tx: { $queryRawUnsafe<T>(q: string): Promise<T> }) =>
      (await tx.$queryRawUnsafe<{ pid: number }[]>('SELECT pg_backend_pid() AS pid'))[0]?.pid;
    const first = await locks.runExclusiveJob('prisma-test', 'dead-start', backend);
    expect(first.executed).toBe(true);
    const dead = first.executed ? first.result : undefined;
    const { clientSpoke } = proxy.hold();
    await proxy.terminateBackends((text, params) => admin.query(text, params));
    const next = locks.runExclusiveJob('prisma-test', 'dead-start', backend);
    await clientSpoke;
    proxy.release();
    const outcome = await next.catch((error: unknown) => error);
    expect(outcome).toMatchObject({ executed: true });
    expect((outcome as { result: number }).result).not.toBe(dead);
    expect(i.checkedOut()).toBe(0);
  });
});
