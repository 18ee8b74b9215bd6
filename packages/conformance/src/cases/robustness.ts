/**
 * Many operations at once: no lost update under the lock, and nothing leaked after a storm of
 * mixed operations with injected failures.
 */
import { randomBytes } from 'node:crypto';
import {
  createLockClient,
  hasCapability,
  isLockkitError,
  type JobResult,
  type LockKey,
} from '@lockkit/core';
import { expect } from 'vitest';
import { type ConformanceAdapter, randomKey } from '../harness.js';
import { caseIt, type Fixture } from '../suite.js';

const tick = () => new Promise((r) => setTimeout(r, 1));

export function robustnessCases<Tx, Session>(
  adapter: ConformanceAdapter<Tx, Session>,
  fixture: () => Fixture<Tx, Session>,
): void {
  caseIt(
    adapter,
    'robustness.counter-fuzz',
    '8 workers × 25 read-modify-write increments under the lock lose no update',
    async () => {
      const f = fixture();
      const schema = `lockkit_conf_${randomBytes(6).toString('hex')}`;
      await f.observer.query(`CREATE SCHEMA ${schema}`);
      try {
        await f.observer.query(`CREATE TABLE ${schema}.counter (n int NOT NULL)`);
        await f.observer.query(`INSERT INTO ${schema}.counter VALUES (0)`);
        const key = randomKey();
        const workers = 8;
        const increments = 25;
        await Promise.all(
          Array.from({ length: workers }, async () => {
            const locks = createLockClient(f.newInstance(1).executor);
            for (let i = 0; i < increments; i++) {
              const r = await locks.withLock(
                key,
                async (_tx, ctx) => {
                  const [row] = await ctx.query(`SELECT n FROM ${schema}.counter`);
                  await tick(); // widen the race window: without the lock, updates get lost
                  await ctx.query(`UPDATE ${schema}.counter SET n = $1`, [Number(row?.n) + 1]);
                },
                { wait: true, timeoutMs: 30_000 },
              );
              expect(r.executed).toBe(true);
            }
          }),
        );
        const [row] = await f.observer.query<{ n: number }>(`SELECT n FROM ${schema}.counter`);
        expect(row?.n).toBe(workers * increments);
      } finally {
        await f.observer.query(`DROP SCHEMA ${schema} CASCADE`);
      }
    },
  );

  caseIt(
    adapter,
    'robustness.mixed-operations',
    '1,000 mixed operations with injected failures leave zero locks and zero checked-out connections',
    async () => {
      const f = fixture();
      const instance = f.newInstance(12);
      const locks = createLockClient(instance.executor);
      const session =
        hasCapability(instance.executor, 'session') && !instance.executor.transactionPooler;
      const keys: LockKey[] = Array.from({ length: 8 }, randomKey);
      const outcomes = new Map<string, number>();
      const count = (what: string) => outcomes.set(what, (outcomes.get(what) ?? 0) + 1);
      let seed = 0x2f6b_9a31;
      const random = (n: number) => {
        seed = (seed * 1_103_515_245 + 12_345) & 0x7fff_ffff;
        return seed % n;
      };
      const injected = new Error('injected task failure');

      const operation = async (): Promise<void> => {
        const key = keys[random(keys.length)] as LockKey;
        const mode = random(3) === 0 ? 'shared' : 'exclusive';
        const fail = random(5) === 0;
        const slow = random(10) === 0;
        const wait = random(3) === 0;
        const task = async (_h: unknown, ctx: { query: (t: string) => Promise<unknown> }) => {
          if (slow) await ctx.query('SELECT pg_sleep(0.05)::text');
          else await tick();
          if (fail) throw injected;
          return 'ok';
        };
        const options = wait ? ({ mode, wait, timeoutMs: 20 } as const) : ({ mode } as const);
        let result: JobResult<string>;
        try {
          if (session && random(4) === 0) {
            result = await locks.withSessionLock(key, task, options);
          } else if (random(8) === 0) {
            result = await locks.withLock(key, task, { ...options, statementTimeoutMs: 20 });
          } else {
            result = await locks.withLock(key, task, options);
          }
          count(result.executed ? 'executed' : 'skipped');
        } catch (error) {
          if (error === injected) count('task failed');
          else if (
            isLockkitError(error) &&
            ['LOCK_TIMEOUT', 'STATEMENT_TIMEOUT'].includes(error.code)
          ) {
            count(error.code);
          } else {
            throw error;
          }
        }
      };

      const lanes = 10;
      const total = 1000;
      let started = 0;
      await Promise.all(
        Array.from({ length: lanes }, async () => {
          while (started < total) {
            started++;
            await operation();
          }
        }),
      );
      const seen = [...outcomes.values()].reduce((a, b) => a + b, 0);
      expect(seen).toBe(total);
      expect(outcomes.get('executed') ?? 0).toBeGreaterThan(0);
      expect(outcomes.get('skipped') ?? 0).toBeGreaterThan(0);
      expect(outcomes.get('task failed') ?? 0).toBeGreaterThan(0);
      // A connection the driver hands back a moment after the call settled is not a leak (Prisma
      // releases after its own bookkeeping: CI saw one still out at the first look on a loaded
      // machine); one still out after two seconds is, as in the suite's after-each check.
      const returned = await f.observer.until(
        async () => ((await instance.checkedOut?.()) ?? 0) === 0,
        2000,
      );
      expect(returned, `${(await instance.checkedOut?.()) ?? 0} connections still out`).toBe(true);
      expect(await f.observer.locksOf(f.applicationName)).toEqual([]);
    },
    120_000,
  );
}
