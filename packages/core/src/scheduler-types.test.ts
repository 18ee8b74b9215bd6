/**
 * Type tests (checked by `pnpm typecheck`; the runtime part only registers): a handler's run type
 * follows the job's mode, so a transaction-mode handler needs no `run.mode` check.
 */
import { describe, expectTypeOf, it } from 'vitest';
import type { LockClient } from './lock.js';
import {
  createScheduler,
  type JobHandler,
  type LeaseRun,
  type RunInfo,
  type TransactionRun,
} from './scheduler.js';

interface Tx {
  readonly native: true;
}
declare const locks: LockClient<Tx, unknown>;

describe('scheduler handler types', () => {
  it('types each handler by its mode', () => {
    // Never called: the checks are at compile time.
    const check = () => {
      const scheduler = createScheduler(locks);
      scheduler.register('tx-default', '* * * * *', (run) => {
        expectTypeOf(run).toEqualTypeOf<TransactionRun<Tx>>();
        expectTypeOf(run.tx).toEqualTypeOf<Tx>();
        expectTypeOf(run.query).toBeFunction();
      });
      scheduler.register(
        'tx-explicit',
        '* * * * *',
        async (run) => {
          expectTypeOf(run.mode).toEqualTypeOf<'transaction'>();
          expectTypeOf(run.tx).toEqualTypeOf<Tx>();
        },
        { mode: 'transaction', retries: 1 },
      );
      scheduler.register(
        'lease',
        '* * * * *',
        async (run) => {
          expectTypeOf(run).toEqualTypeOf<LeaseRun<Tx>>();
          expectTypeOf(run.lease.token).toEqualTypeOf<bigint>();
        },
        { mode: 'lease', lease: { ttlMs: 60_000 } },
      );
      // A mode known only at run time: the handler gets the union and checks it.
      const mode = process.env.MODE === 'lease' ? ('lease' as const) : ('transaction' as const);
      const either: JobHandler<Tx> = (run) => {
        expectTypeOf(run).toEqualTypeOf<TransactionRun<Tx> | LeaseRun<Tx>>();
      };
      scheduler.register('either', '* * * * *', either, { mode });
      // @ts-expect-error a lease-mode handler needs mode: 'lease'
      scheduler.register('wrong', '* * * * *', (run: LeaseRun<Tx>) => run.lease);
      // @ts-expect-error a transaction-mode handler cannot be registered in lease mode
      scheduler.register('wrong2', '* * * * *', (run: TransactionRun<Tx>) => run.tx, {
        mode: 'lease',
      });
    };
    expectTypeOf(check).toBeFunction();
  });

  it('tells every run when and why it runs', () => {
    expectTypeOf<RunInfo['tick']>().toEqualTypeOf<Date>();
    expectTypeOf<RunInfo['lateMs']>().toEqualTypeOf<number>();
    expectTypeOf<RunInfo['catchUp']>().toEqualTypeOf<boolean>();
    expectTypeOf<RunInfo['attempt']>().toEqualTypeOf<number>();
  });
});
