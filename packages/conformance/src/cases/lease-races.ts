/**
 * Leases under contention: a claim never waits on another holder and never hands out a lease that
 * is already (nearly) over; neither a rival's claims nor the holder's own fenced writes hold up the
 * holder's renewals; a rival that loses learns who holds the lease.
 */
import {
  createLockClient,
  LeaseLostError,
  type LeaseResult,
  type LockClient,
  LockKey,
} from '@lockkit/core';
import pg from 'pg';
import { expect } from 'vitest';
import { type ConformanceAdapter, gate, rejection } from '../harness.js';
import { startRoundTripProxy } from '../proxy.js';
import { casesOf, type Fixture } from '../suite.js';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Whether `promise` settles within `ms` (it keeps running either way). */
async function settlesWithin(promise: Promise<unknown>, ms: number): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined;
  const settled = await Promise.race([
    promise.then(
      () => true,
      () => true,
    ),
    new Promise<false>((resolve) => {
      timer = setTimeout(() => resolve(false), ms);
    }),
  ]);
  clearTimeout(timer);
  return settled;
}

/** What the leases group shares with these cases. */
export interface LeaseCaseKit<Tx, Session> {
  /** Runs `fn` with a fresh schema holding lockkit's tables, and a lock client on it. */
  readonly withSchema: (
    fn: (schema: string, locks: LockClient<Tx, Session>) => Promise<void>,
  ) => Promise<void>;
  /** A lease name no other test uses. */
  readonly job: () => { namespace: string; jobKey: string };
}

export function leaseRaceCases<Tx, Session>(
  adapter: ConformanceAdapter<Tx, Session>,
  fixture: () => Fixture<Tx, Session>,
  { withSchema, job }: LeaseCaseKit<Tx, Session>,
): void {
  const test = casesOf(adapter);

  /** A plain connection straight to the server, for holding locks the way another session would. */
  const directClient = async (f: Fixture<Tx, Session>): Promise<pg.Client> => {
    const client = new pg.Client({
      connectionString: f.adapter.observerUrl?.() ?? f.adapter.databaseUrl(),
    });
    client.on('error', () => {});
    await client.connect();
    return client;
  };

  /** Milliseconds the database still gives the lease held under `token` (negative: expired). */
  const dbRemainingMs = async (
    f: Fixture<Tx, Session>,
    schema: string,
    lease: { namespace: string; jobKey: string; token: bigint },
  ): Promise<number> => {
    const [row] = await f.observer.query<{ ms: string }>(
      `SELECT (extract(epoch FROM expires_at - clock_timestamp()) * 1000)::text AS ms
         FROM "${schema}".leases WHERE namespace = $1 AND job_key = $2 AND token = $3::int8`,
      [lease.namespace, lease.jobKey, String(lease.token)],
    );
    return row ? Number(row.ms) : Number.NEGATIVE_INFINITY;
  };

  test(
    'leases.claim-keeps-margin',
    'a claim that comes back too late to renew in time (a slow link) is given back without starting the task',
    () =>
      withSchema(async (schema, locks) => {
        const f = fixture();
        const { namespace, jobKey } = job();
        // 250 ms each way: from sending the claim to the COMMIT's answer takes at least two round
        // trips, 1,000 ms: more than ttlMs − safetyMarginMs (600 ms), so on the old code the task
        // started on a lease the database had already let go.
        const proxy = await startRoundTripProxy(f.url, { latencyMs: 250 });
        try {
          // The engine self-test is the engine group's business: on this link its round trips
          // and a second connection would only add seconds before the claim under test.
          const slow = createLockClient(f.newInstance(2, proxy.url).executor, {
            schema,
            engineSelfTest: false,
          });
          let remainingAtStart: number | undefined;
          const outcome = await rejection(
            slow.runWithLease(
              namespace,
              jobKey,
              async (lease) => {
                remainingAtStart = await dbRemainingMs(f, schema, lease);
                return 'ran';
              },
              { ttlMs: 1000, safetyMarginMs: 400, renewEveryMs: 200 },
            ),
          ).catch((error: unknown) => error);
          expect({ remainingAtStart, lost: outcome instanceof LeaseLostError }).toEqual({
            remainingAtStart: undefined,
            lost: true,
          });
          // The useless claim was given back (or, its give-back on the same slow link arriving after
          // the short TTL, has expired): the next claimer gets the lease.
          const next = await locks.runWithLease(namespace, jobKey, async () => 'ran');
          expect(next).toMatchObject({ executed: true, result: 'ran' });
        } finally {
          await proxy.close();
        }
      }),
    30_000,
  );

  test(
    'leases.no-two-holders-after-fence',
    'a holder whose fenced write outlives its TTL: rivals get { executed: false, holder } at once, never an expired lease, and never run at the same time',
    () =>
      withSchema(async (schema, locks) => {
        const f = fixture();
        const { namespace, jobKey } = job();
        const rivals = [0, 1].map(() => createLockClient(f.newInstance(3).executor, { schema }));
        const inFence = gate();
        const closeFence = gate();
        let aToken: bigint | undefined;
        const claimA = (client: LockClient<Tx, Session>) =>
          client.runWithLease(
            namespace,
            jobKey,
            async (lease) => {
              aToken = lease.token;
              await lease.fenced(async () => {
                inFence.open();
                await closeFence.promise;
              });
            },
            { heartbeat: false, ttlMs: 500, safetyMarginMs: 100 },
          );
        // A claim answered too late to keep (over half of A's 400 ms: a loaded machine, seen in CI
        // at 212 ms) is given back before its task starts, and the next claim gets the lease at
        // once. That happens here on purpose, every run: A's first claim goes through a proxy that
        // holds the claim's answer 250 ms.
        const proxy = await startRoundTripProxy(f.url);
        try {
          const late = createLockClient(f.newInstance(2, proxy.url).executor, {
            schema,
            engineSelfTest: false,
          });
          // The claim statement (its other statements vary by adapter and driver).
          const held = proxy.trapStatement((s) => s.text.includes('taken AS ('), 'hold-reply');
          const lateOutcome = claimA(late).then(
            () => 'completed',
            (error: unknown) => error,
          );
          expect(await Promise.race([held.fired.then(() => 'held'), lateOutcome])).toBe('held');
          await sleep(250);
          held.release();
          const given = await lateOutcome;
          expect({ lost: given instanceof LeaseLostError, started: aToken !== undefined }).toEqual({
            lost: true,
            started: false,
          });
        } finally {
          await proxy.close();
        }
        // Then A claims directly. On a loaded machine that claim too may come back late and be given
        // back (LeaseLostError, no token seen): A claims again, a few times.
        let aOutcome: Promise<unknown>;
        for (let attempt = 1; ; attempt++) {
          const a = claimA(locks);
          aOutcome = a.then(
            () => 'completed',
            (error: unknown) => error,
          );
          const first = await Promise.race([inFence.promise.then(() => 'in fence'), aOutcome]);
          if (first === 'in fence') break;
          if (!(first instanceof LeaseLostError) || aToken !== undefined || attempt === 5)
            throw first instanceof Error ? first : new Error(`A's claim settled: ${String(first)}`);
        }
        // A's lease expires in the database while its fenced write stays open.
        const expired = await f.observer.until(async () => {
          const [row] = await f.observer.query<{ expired: boolean }>(
            `SELECT expires_at <= clock_timestamp() AS expired FROM "${schema}".leases
              WHERE namespace = $1 AND job_key = $2`,
            [namespace, jobKey],
          );
          return row?.expired === true;
        }, 5000);
        expect(expired).toBe(true);

        let fenceOpen = true;
        const settledWhileOpen = [0, 0];
        const wrongWhileOpen: unknown[] = [];
        const running = new Set<AbortSignal>();
        let overlaps = 0;
        const remainingAtStart: number[] = [];
        let runs = 0;
        let lostRuns = 0;
        const deadline = performance.now() + 20_000;
        const rival = async (client: LockClient<Tx, Session>, i: number) => {
          while (runs < 2 && performance.now() < deadline) {
            const r = await client
              .runWithLease(
                namespace,
                jobKey,
                async (lease) => {
                  for (const other of running)
                    if (!other.aborted && !lease.signal.aborted) overlaps++;
                  running.add(lease.signal);
                  try {
                    remainingAtStart.push(await dbRemainingMs(f, schema, lease));
                    await sleep(300);
                    for (const other of running) {
                      if (other !== lease.signal && !other.aborted && !lease.signal.aborted)
                        overlaps++;
                    }
                  } finally {
                    running.delete(lease.signal);
                  }
                },
                { ttlMs: 1000, renewEveryMs: 100, safetyMarginMs: 200 },
              )
              .catch((error: unknown) => {
                if (!(error instanceof LeaseLostError)) throw error;
                lostRuns++;
                return { executed: true as const, result: undefined, token: error.token };
              });
            if (fenceOpen) {
              settledWhileOpen[i] = (settledWhileOpen[i] ?? 0) + 1;
              if (r.executed || r.holder?.token !== aToken) wrongWhileOpen.push(r);
            }
            if (r.executed) runs++;
            await sleep(20);
          }
        };
        const both = Promise.all(rivals.map(rival));
        // A's write stays open longer than the rivals' own TTL: a claim that waited for it would
        // come back with its lease already over...
        await sleep(1500);
        // ...and until each rival has been answered twice while it is open: on a loaded machine
        // 1.5 s may not be enough for that. (Bounded: a claim that waits for the fence never is.)
        await f.observer.until(async () => settledWhileOpen.every((n) => n >= 2), 15_000);
        fenceOpen = false;
        closeFence.open();
        await both;
        expect(await aOutcome).toBeInstanceOf(LeaseLostError);
        expect({
          eachSettledWhileOpen: settledWhileOpen.every((n) => n >= 2),
          wrongWhileOpen,
          overlaps,
          atLeastTwoRuns: runs >= 2,
          lostRuns,
          lessThanMarginAtStart: remainingAtStart.filter((ms) => ms < 200),
        }).toEqual({
          eachSettledWhileOpen: true,
          wrongWhileOpen: [],
          overlaps: 0,
          atLeastTwoRuns: true,
          lostRuns: 0,
          lessThanMarginAtStart: [],
        });
      }),
    60_000,
  );

  test(
    'leases.claim-never-waits',
    "a rival's claim returns { executed: false, holder } at once while the holder has a fenced write or a renewal open, and gives up with STATEMENT_TIMEOUT under a table lock",
    () =>
      withSchema(async (schema, locks) => {
        const f = fixture();
        const { namespace, jobKey } = job();
        const rival = createLockClient(f.newInstance(2).executor, { schema });
        const other = await directClient(f);
        const inFence = gate();
        const closeFence = gate();
        const release = gate();
        let token: bigint | undefined;
        const holder = locks.runWithLease(
          namespace,
          jobKey,
          async (lease) => {
            token = lease.token;
            await lease.fenced(async () => {
              inFence.open();
              await closeFence.promise;
            });
            await release.promise;
          },
          { ttlMs: 20_000 },
        );
        try {
          await Promise.race([inFence.promise, holder]);
          // 1. The holder's fenced write is open.
          const duringFence = rival.runWithLease(namespace, jobKey, async () => 'stolen');
          const fenceSettled = await settlesWithin(duringFence, 5000);
          closeFence.open();
          // 2. A renewal (or the holder's finish) is in flight: its row lock is held.
          await other.query('BEGIN');
          await other.query(
            `UPDATE "${schema}".leases SET heartbeat_at = clock_timestamp()
              WHERE namespace = $1 AND job_key = $2`,
            [namespace, jobKey],
          );
          const duringRenewal = rival.runWithLease(namespace, jobKey, async () => 'stolen');
          const renewalSettled = await settlesWithin(duringRenewal, 5000);
          await other.query('ROLLBACK');
          // 3. A lock no claim can skip: an operator's LOCK TABLE. The claim's statement_timeout
          // (1 s here) is the backstop: it gives up with a typed error instead of hanging.
          await other.query('BEGIN');
          await other.query(`LOCK TABLE "${schema}".leases IN ACCESS EXCLUSIVE MODE`);
          const duringTableLock = rival
            .runWithLease(namespace, jobKey, async () => 'stolen', {
              ttlMs: 1000,
              safetyMarginMs: 200,
            })
            .catch((error: unknown) => error);
          const tableLockSettled = await settlesWithin(duringTableLock, 10_000);
          await other.query('ROLLBACK');
          expect({ fenceSettled, renewalSettled, tableLockSettled }).toEqual({
            fenceSettled: true,
            renewalSettled: true,
            tableLockSettled: true,
          });
          for (const r of [await duringFence, await duringRenewal]) {
            expect(r).toMatchObject({ executed: false, holder: { token } });
          }
          expect(await duringTableLock).toMatchObject({ code: 'STATEMENT_TIMEOUT' });
        } finally {
          closeFence.open();
          await other.query('ROLLBACK').catch(() => {});
          release.open();
          await holder.catch(() => {});
          await other.end();
        }
        const [row] = await f.observer.query<{ status: string }>(
          `SELECT status FROM "${schema}".leases WHERE namespace = $1 AND job_key = $2`,
          [namespace, jobKey],
        );
        expect(row?.status).toBe('COMPLETED');
      }),
    30_000,
  );

  test(
    'leases.slow-contender',
    "a contender stopped after each of its claim's statements (the proxy holds every answer until the holder has renewed twice more) holds up none of the live holder's renewals: the holder keeps its lease",
    () =>
      withSchema(async (schema) => {
        const f = fixture();
        const { namespace, jobKey } = job();
        // Renewals counted as events, and awaited as such: no window, no sleep. The contender is
        // as slow as the test wants (each answer is held until the holder has renewed twice more),
        // and the holder's TTL is long enough that only a renewal queued behind the contender —
        // lockkit's fault — could make it lose its lease, however busy the machine.
        let renewals = 0;
        let onRenewal: (() => void) | undefined;
        const holderLocks = createLockClient(f.newInstance(3).executor, {
          schema,
          onEvent: (event) => {
            if (event.type === 'lease-renewed') {
              renewals++;
              onRenewal?.();
            }
          },
        });
        const proxy = await startRoundTripProxy(f.url);
        try {
          // No engine self-test on the held link: only the claims go through it.
          const contender = createLockClient(f.newInstance(2, proxy.url).executor, {
            schema,
            engineSelfTest: false,
          });
          const attempts: LeaseResult<string>[] = [];
          let statementsHeld = 0;
          /** Resolves once the holder has renewed `n` more times, or its lease is lost. */
          const renewedMore = (n: number, lost: AbortSignal) =>
            new Promise<void>((resolve) => {
              const target = renewals + n;
              const check = () => {
                if (renewals >= target || lost.aborted) {
                  onRenewal = undefined;
                  lost.removeEventListener('abort', check);
                  resolve();
                }
              };
              onRenewal = check;
              lost.addEventListener('abort', check);
              check();
            });
          /** One claim by the contender, its every answer held at the proxy until two renewals. */
          const heldClaim = async (lost: AbortSignal) => {
            let claimDone = false;
            const claiming = contender
              .runWithLease(namespace, jobKey, async () => 'stolen', { ttlMs: 1000 })
              .finally(() => {
                claimDone = true;
              });
            for (;;) {
              const trap = proxy.trapStatement(0, 'hold-reply');
              const next = await Promise.race([
                trap.fired.then(() => 'held' as const),
                claiming.then(
                  () => 'done' as const,
                  () => 'done' as const,
                ),
              ]);
              if (next === 'done' || claimDone) {
                trap.release();
                break;
              }
              statementsHeld++;
              await renewedMore(2, lost);
              trap.release();
            }
            return claiming;
          };
          const outcome = await holderLocks
            .runWithLease(
              namespace,
              jobKey,
              async (lease) => {
                const before = renewals;
                while (attempts.length < 2 && !lease.signal.aborted) {
                  attempts.push(await heldClaim(lease.signal));
                }
                return {
                  aborted: lease.signal.aborted,
                  renewedMeanwhile: renewals - before,
                  token: lease.token,
                };
              },
              { ttlMs: 5000, renewEveryMs: 100, safetyMarginMs: 1000 },
            )
            .catch((error: unknown) => error);
          expect(outcome).toMatchObject({ executed: true, result: { aborted: false } });
          const result = (outcome as { result: { token: bigint; renewedMeanwhile: number } })
            .result;
          // Every held statement of both claims saw two renewals go through while it was held.
          expect(statementsHeld).toBeGreaterThanOrEqual(2);
          expect(result.renewedMeanwhile).toBeGreaterThanOrEqual(2 * statementsHeld);
          expect(attempts).toHaveLength(2);
          for (const a of attempts) {
            expect(a).toMatchObject({ executed: false, holder: { token: result.token } });
          }
        } finally {
          await proxy.close();
        }
      }),
    60_000,
  );

  test(
    'leases.own-fence-keeps-renewing',
    "the holder's own fenced write, open longer than the TTL, does not hold up its renewals: the run completes",
    () =>
      withSchema(async (schema) => {
        const f = fixture();
        const { namespace, jobKey } = job();
        await f.observer.query(`CREATE TABLE "${schema}".ledger (token bigint)`);
        let renewals = 0;
        const holderLocks = createLockClient(f.newInstance(3).executor, {
          schema,
          onEvent: (event) => {
            if (event.type === 'lease-renewed') renewals++;
          },
        });
        const outcome = await holderLocks
          .runWithLease(
            namespace,
            jobKey,
            async (lease) => {
              let renewedDuringWrite = 0;
              await lease.fenced(async (_tx, query) => {
                await query(`INSERT INTO "${schema}".ledger VALUES ($1::int8)`, [
                  String(lease.token),
                ]);
                const atOpen = renewals;
                // Open across four renewals (500 ms apart: 2 s, past the 1.5 s TTL), or until lost.
                await f.observer.until(
                  async () => renewals - atOpen >= 4 || lease.signal.aborted,
                  15_000,
                );
                renewedDuringWrite = renewals - atOpen;
              });
              return { renewedDuringWrite, aborted: lease.signal.aborted };
            },
            { ttlMs: 1500 },
          )
          .catch((error: unknown) => error);
        expect(outcome).toMatchObject({
          executed: true,
          result: { renewedDuringWrite: 4, aborted: false },
        });
        const rows = await f.observer.query<{ status: string; written: string }>(
          `SELECT l.status, (SELECT count(*) FROM "${schema}".ledger)::text AS written
             FROM "${schema}".leases l WHERE namespace = $1 AND job_key = $2`,
          [namespace, jobKey],
        );
        expect(rows).toEqual([{ status: 'COMPLETED', written: '1' }]);
      }),
    30_000,
  );

  test(
    'leases.holder-reported',
    'a rival that loses the race for the claim itself still learns the holder (read without locking)',
    () =>
      withSchema(async (schema, locks) => {
        const f = fixture();
        const { namespace, jobKey } = job();
        const rival = createLockClient(f.newInstance(2).executor, { schema });
        const claimer = await directClient(f);
        const [k1, k2] = LockKey.fromNames(namespace, jobKey).pair as readonly [number, number];
        const running = gate<bigint>();
        const finish = gate();
        const holder = locks.runWithLease(
          namespace,
          jobKey,
          async (lease) => {
            running.open(lease.token);
            await finish.promise;
          },
          { ttlMs: 20_000 },
        );
        try {
          const token = await Promise.race([running.promise, holder.then(() => 0n)]);
          const direct = await rival.runWithLease(namespace, jobKey, async () => 'stolen');
          // Another claimer is mid-claim: it holds the job's advisory lock.
          await claimer.query('SELECT pg_advisory_lock($1::int4, $2::int4)', [k1, k2]);
          const raced = await rival.runWithLease(namespace, jobKey, async () => 'stolen');
          for (const r of [direct, raced]) {
            expect(r).toMatchObject({
              executed: false,
              holder: { token, owner: expect.any(String), expiresAt: expect.any(Date) },
            });
          }
          finish.open();
          await holder;
          // Finished: nobody holds the lease, and a rival racing a claimer is told so.
          const afterFinish = await rival.runWithLease(namespace, jobKey, async () => 'stolen');
          expect(afterFinish).toEqual({ executed: false, holder: undefined });
        } finally {
          finish.open();
          await holder.catch(() => {});
          await claimer.query('SELECT pg_advisory_unlock_all()').catch(() => {});
          await claimer.end();
        }
      }),
    30_000,
  );
}
