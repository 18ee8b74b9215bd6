/**
 * Leases: claimed by exactly one, renewed while held, lost by a stalled holder whose late writes
 * are refused, tokens strictly increasing, bad input and aborts refused before any SQL, and taken
 * over after the holder's process is killed. Under contention: `lease-races.ts`; the keep-alive
 * fuzz: `lease-fuzz.ts`.
 */
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import {
  createLockClient,
  isLockkitError,
  LeaseLostError,
  type LeaseResult,
  type LockClient,
  LockKey,
  tokenParts,
} from '@lockkit/core';
import { expect, it, onTestFinished } from 'vitest';
import { aborted, type ConformanceAdapter, gate, rejection } from '../harness.js';
import { startRoundTripProxy } from '../proxy.js';
import { casesOf, type Fixture, withLockkitSchema } from '../suite.js';
import { leaseFuzzCases } from './lease-fuzz.js';
import { leaseRaceCases } from './lease-races.js';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export function leaseCases<Tx, Session>(
  adapter: ConformanceAdapter<Tx, Session>,
  fixture: () => Fixture<Tx, Session>,
): void {
  const withSchema = (fn: (schema: string, locks: LockClient<Tx, Session>) => Promise<void>) =>
    withLockkitSchema(fixture(), fn);

  const job = () => ({
    namespace: 'lockkit-conformance-leases',
    jobKey: randomBytes(8).toString('hex'),
  });
  const test = casesOf(adapter);

  test(
    'leases.migrate-idempotent',
    'migrate from many instances at once applies each version once; bad schema names are refused',
    async () => {
      const f = fixture();
      const schema = `lockkit_conf_${randomBytes(6).toString('hex')}`;
      try {
        const results = await Promise.all(
          Array.from({ length: 6 }, () =>
            createLockClient(f.newInstance(2).executor, { schema }).migrate(),
          ),
        );
        expect(results.filter((r) => r.applied.length > 0)).toHaveLength(1);
        expect(new Set(results.map((r) => r.to)).size).toBe(1);
        const again = await createLockClient(f.instance.executor, { schema }).migrate();
        expect(again.applied).toEqual([]);
        const versions = await f.observer.query<{ version: number }>(
          `SELECT version FROM "${schema}".migrations ORDER BY version`,
        );
        expect(versions.map((v) => v.version)).toEqual(
          Array.from({ length: again.to }, (_, i) => i + 1),
        );
      } finally {
        await f.observer.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
      }
      for (const bad of ['', 'a-b', 'x"; DROP TABLE y; --', '1abc', 'a'.repeat(64)]) {
        expect(() => createLockClient(f.instance.executor, { schema: bad })).toThrow(
          expect.objectContaining({ code: 'OPTION_INVALID' }),
        );
      }
    },
  );

  test(
    'leases.exactly-one-of-50',
    '50 contenders claim one lease: exactly one runs, the others learn who holds it',
    () =>
      withSchema(async (schema) => {
        const f = fixture();
        const instance = f.newInstance(55);
        const locks = createLockClient(instance.executor, { schema });
        const { namespace, jobKey } = job();
        const release = gate();
        let decided = 0;
        const results = await Promise.all(
          Array.from({ length: 50 }, async () => {
            const r = await locks.runWithLease(
              namespace,
              jobKey,
              () => release.promise.then(() => 'ran'),
              {
                ttlMs: 20_000,
              },
            );
            if (!r.executed && ++decided === 49) release.open();
            return r;
          }),
        );
        const winners = results.filter((r) => r.executed);
        expect(winners).toHaveLength(1);
        const losers = results.filter(
          (r): r is Extract<LeaseResult<string>, { executed: false }> => !r.executed,
        );
        expect(losers).toHaveLength(49);
        // Those that found the row (not merely the claim lock busy) name the winner's token.
        for (const l of losers) {
          if (l.holder) expect(l.holder.token).toBe((winners[0] as { token: bigint }).token);
        }
      }),
    60_000,
  );

  test(
    'leases.no-lock-or-connection-while-running',
    'while the task runs, no advisory lock is held and no connection is checked out',
    () =>
      withSchema(async (schema) => {
        const f = fixture();
        const instance = f.newInstance(4);
        const locks = createLockClient(instance.executor, { schema });
        const { namespace, jobKey } = job();
        const r = await locks.runWithLease(
          namespace,
          jobKey,
          async (lease) => ({
            locks: (await f.observer.locksOn(LockKey.fromNames(namespace, jobKey))).length,
            all: (await f.observer.locksOf(f.applicationName)).length,
            checkedOut: (await instance.checkedOut?.()) ?? 0,
            row: await f.observer.query<{ status: string; token: string }>(
              `SELECT status, token::text FROM "${schema}".leases WHERE namespace = $1 AND job_key = $2`,
              [namespace, jobKey],
            ),
            token: lease.token,
          }),
          { heartbeat: false, ttlMs: 10_000 },
        );
        expect(r.executed).toBe(true);
        if (!r.executed) return;
        expect(r.result).toMatchObject({ locks: 0, all: 0, checkedOut: 0 });
        expect(r.result.row).toEqual([{ status: 'IN_PROGRESS', token: String(r.result.token) }]);
        const [after] = await f.observer.query<{ status: string }>(
          `SELECT status FROM "${schema}".leases WHERE namespace = $1 AND job_key = $2`,
          [namespace, jobKey],
        );
        expect(after?.status).toBe('COMPLETED');
      }),
  );

  test(
    'leases.renewal-keeps-it',
    'the heartbeat keeps a lease alive far past its TTL; contenders skip all along',
    () =>
      withSchema(async (schema, locks) => {
        const f = fixture();
        const other = createLockClient(f.newInstance(2).executor, { schema });
        const { namespace, jobKey } = job();
        const LEASE = { ttlMs: 1000, renewEveryMs: 100, safetyMarginMs: 200 } as const;
        let contenderRuns = 0;
        let triesPastFirstExpiry = 0;
        // This process's event loop, watched independently of lockkit: the longest a 10 ms timer
        // ran late. A holder whose process stands still for most of its lease must give it up.
        let longestStall = 0;
        let expected = performance.now() + 10;
        const ticker = setInterval(() => {
          const now = performance.now();
          longestStall = Math.max(longestStall, now - expected);
          expected = now + 10;
        }, 10);
        const held = await locks
          .runWithLease(
            namespace,
            jobKey,
            async (lease) => {
              // Held until the database's own clock says so — the row renewed to three TTLs past
              // the claim, and contenders refused after the claim's first TTL had run out — not
              // for a time measured here: on a loaded machine this loop may run few times.
              for (;;) {
                const [row] = await f.observer.query<{ past_first: boolean; far: boolean }>(
                  `SELECT clock_timestamp() > claimed_at + $3::float8 * interval '1 ms' AS past_first,
                          expires_at >= claimed_at + $4::float8 * interval '1 ms' AS far
                     FROM "${schema}".leases WHERE namespace = $1 AND job_key = $2`,
                  [namespace, jobKey, LEASE.ttlMs, 3 * LEASE.ttlMs],
                );
                if (lease.signal.aborted) return 'lost';
                if (row?.far && triesPastFirstExpiry >= 2) return 'kept';
                const c = await other.runWithLease(namespace, jobKey, async () => 'stolen', {
                  ttlMs: LEASE.ttlMs,
                });
                if (c.executed) contenderRuns++;
                else if (row?.past_first) triesPastFirstExpiry++;
                await sleep(100); // a pace for the contender, not a wait for anything
              }
            },
            LEASE,
          )
          .catch((error: unknown) => {
            if (error instanceof LeaseLostError) return { executed: true, result: 'lost' } as const;
            throw error;
          })
          .finally(() => clearInterval(ticker));
        // Never: whatever the machine's load, no contender ran while the lease was held.
        expect(contenderRuns).toBe(0);
        // Kept — unless this process stood still for half the time the heartbeat has to renew
        // (ttlMs − safetyMarginMs): a stalled holder must let go, and that is not a lost lease.
        const window = LEASE.ttlMs - LEASE.safetyMarginMs;
        if (!held.executed || held.result !== 'kept')
          expect(
            longestStall,
            `the lease was lost (${held.executed ? held.result : 'never claimed'}) while this process's timers ran at most ${Math.round(longestStall)} ms late`,
          ).toBeGreaterThanOrEqual(window / 2);
        else expect(held).toMatchObject({ executed: true, result: 'kept' });
      }),
    30_000,
  );

  test(
    'leases.stalled-holder-loses',
    'a holder that stops renewing loses the lease at expiry; its late fenced write and completion are refused',
    () =>
      withSchema(async (schema, locks) => {
        const f = fixture();
        const other = createLockClient(f.newInstance(2).executor, { schema });
        const { namespace, jobKey } = job();
        await f.observer.query(`CREATE TABLE "${schema}".ledger (writer text, token bigint)`);
        const takenOver = gate<bigint>();
        const staleClaimed = gate();
        const stale = locks.runWithLease(
          namespace,
          jobKey,
          async (lease) => {
            await lease.fenced((_tx, query) =>
              query(`INSERT INTO "${schema}".ledger VALUES ('stale', $1::int8)`, [
                String(lease.token),
              ]),
            );
            staleClaimed.open();
            // Paused: no heartbeat. The local deadline tells this holder it is lost...
            const reason = await aborted(lease.signal, 5000);
            expect(reason).toBeInstanceOf(LeaseLostError);
            // ...but it carries on as a paused-then-resumed worker would, after a takeover.
            await takenOver.promise;
            const late = await rejection(
              lease.fenced((_tx, query) =>
                query(`INSERT INTO "${schema}".ledger VALUES ('stale-late', $1::int8)`, [
                  String(lease.token),
                ]),
              ),
            );
            expect(late).toBeInstanceOf(LeaseLostError);
            return lease.token;
          },
          { heartbeat: false, ttlMs: 400, safetyMarginMs: 100 },
        );
        const staleOutcome = rejection(stale); // observed from now on: it rejects mid-loop
        await Promise.race([staleClaimed.promise, stale]); // the stale holder claims first
        // The new holder can claim only once the stale lease has expired.
        let next: LeaseResult<bigint> | undefined;
        const deadline = Date.now() + 10_000;
        while (Date.now() < deadline) {
          next = await other.runWithLease(namespace, jobKey, async (lease) => {
            await lease.fenced((_tx, query) =>
              query(`INSERT INTO "${schema}".ledger VALUES ('new', $1::int8)`, [
                String(lease.token),
              ]),
            );
            takenOver.open(lease.token);
            return lease.token;
          });
          if (next.executed) break;
          await sleep(50);
        }
        expect(next?.executed).toBe(true);
        const staleError = await staleOutcome;
        expect(staleError).toBeInstanceOf(LeaseLostError);
        const ledger = await f.observer.query<{ writer: string; token: string }>(
          `SELECT writer, token::text FROM "${schema}".ledger ORDER BY token, writer`,
        );
        expect(ledger.map((l) => l.writer)).toEqual(['stale', 'new']);
        expect(BigInt((ledger[1] as { token: string }).token)).toBe(
          BigInt((ledger[0] as { token: string }).token) + 1n,
        );
        const [row] = await f.observer.query<{ status: string; token: string }>(
          `SELECT status, token::text FROM "${schema}".leases WHERE namespace = $1 AND job_key = $2`,
          [namespace, jobKey],
        );
        // The stale holder's completion did not overwrite the new holder's record.
        expect(row).toEqual({ status: 'COMPLETED', token: (ledger[1] as { token: string }).token });
      }),
    30_000,
  );

  test(
    'leases.tokens-increase',
    'every claim gets a strictly greater token; failures are recorded under their token',
    () =>
      withSchema(async (schema, locks) => {
        const f = fixture();
        const { namespace, jobKey } = job();
        const tokens: bigint[] = [];
        for (let i = 0; i < 5; i++) {
          if (i === 2) {
            const boom = new Error('run 3 failed');
            expect(
              await rejection(
                locks.runWithLease(namespace, jobKey, (lease) => {
                  tokens.push(lease.token);
                  throw boom;
                }),
              ),
            ).toBe(boom);
            const [row] = await f.observer.query<{ status: string; last_error: string }>(
              `SELECT status, last_error FROM "${schema}".leases WHERE namespace = $1 AND job_key = $2`,
              [namespace, jobKey],
            );
            expect(row).toEqual({ status: 'FAILED', last_error: 'Error: run 3 failed' });
            continue;
          }
          const r = await locks.runWithLease(namespace, jobKey, async (lease) => lease.token);
          if (r.executed) tokens.push(r.result);
        }
        expect(tokens).toHaveLength(5);
        for (let i = 1; i < tokens.length; i++) {
          expect((tokens[i] as bigint) > (tokens[i - 1] as bigint)).toBe(true);
        }
        const [row] = await f.observer.query<{ attempts: string; status: string }>(
          `SELECT attempts::text, status FROM "${schema}".leases WHERE namespace = $1 AND job_key = $2`,
          [namespace, jobKey],
        );
        expect(row).toEqual({ attempts: '5', status: 'COMPLETED' });
      }),
  );

  test(
    'leases.bad-options-and-abort',
    'an aborted signal rejects with ABORTED and bad options with OPTION_INVALID before any SQL; a task that returns after its abort is recorded FAILED',
    () =>
      withSchema(async (schema, locks) => {
        const f = fixture();
        const { namespace, jobKey } = job();
        const rowOf = () =>
          f.observer.query<{ status: string; last_error: string | null }>(
            `SELECT status, last_error FROM "${schema}".leases WHERE namespace = $1 AND job_key = $2`,
            [namespace, jobKey],
          );
        let calls = 0;
        const task = async () => {
          calls++;
          return 'ran';
        };
        const shutdown = new AbortController();
        shutdown.abort(new Error('shutting down'));
        const early = await rejection(
          locks.runWithLease(namespace, jobKey, task, { signal: shutdown.signal }),
        );
        expect(isLockkitError(early) && early.code).toBe('ABORTED');
        for (const bad of [null, 'fast', 42, ['ttlMs']]) {
          const refused = await rejection(
            locks.runWithLease(namespace, jobKey, task, bad as unknown as undefined),
          );
          expect(isLockkitError(refused) && refused.code, `options ${JSON.stringify(bad)}`).toBe(
            'OPTION_INVALID',
          );
        }
        expect({ calls, rows: await rowOf() }).toEqual({ calls: 0, rows: [] });

        // Aborted mid-run, the task returns (say, after breaking out of its loop): that run did
        // not complete, and the record must not say it did.
        const stop = new AbortController();
        const midRun = await rejection(
          locks.runWithLease(
            namespace,
            jobKey,
            async (lease) => {
              stop.abort(new Error('shutting down'));
              expect(lease.signal.aborted).toBe(true);
              return 'stopped early';
            },
            { signal: stop.signal },
          ),
        );
        expect(isLockkitError(midRun) && midRun.code).toBe('ABORTED');
        const [row] = await rowOf();
        expect(row?.status).toBe('FAILED');
        expect(row?.last_error).toMatch(/abort/i);
      }),
  );

  leaseRaceCases(adapter, fixture, { withSchema, job });
  leaseFuzzCases(adapter, fixture);

  if (!adapter.workerModule) {
    it.skip(`leases.killed-holder-process: skipped — the adapter gave no workerModule to run in a worker process`, () => {});
    return;
  }
  const workerModule = adapter.workerModule;
  test(
    'leases.finish-survives-a-lost-reply',
    "the link dies after the finish's COMMIT was sent (as in a failover): the holder asks again on a new connection while its lease holds, finds its run recorded, and reports it done — the job is free, not left to expire and run again",
    () =>
      withSchema(async (schema) => {
        const f = fixture();
        const { namespace, jobKey } = job();
        const proxy = await startRoundTripProxy(f.url);
        // Closed after the fixture's checks, which may still talk through it.
        onTestFinished(() => proxy.close());
        {
          const locks = createLockClient(f.newInstance(2, proxy.url).executor, { schema });
          let cut: Promise<void> | undefined;
          const run = await locks.runWithLease(
            namespace,
            jobKey,
            async () => {
              // The next COMMIT is the finish's (renewals come every ttlMs / 3: not before it).
              cut = proxy.holdCommitReply();
              return 'done';
            },
            { ttlMs: 30_000 },
          );
          await cut;
          expect(run).toMatchObject({ executed: true, result: 'done' });
          const [row] = await f.observer.query<{ status: string; token: string }>(
            `SELECT status, token::text AS token FROM "${schema}".leases WHERE namespace = $1 AND job_key = $2`,
            [namespace, jobKey],
          );
          expect(row?.status).toBe('COMPLETED');
          if (!run.executed) throw new Error('unreachable');
          expect(row?.token).toBe(String(run.token));
          // Free at once: the next claim does not wait 30 s for an expiry.
          const next = await locks.runWithLease(namespace, jobKey, () => 'again');
          expect(next).toMatchObject({ executed: true, result: 'again' });
        }
      }),
    30_000,
  );

  test(
    'leases.token-epoch',
    'a failover that lost the newest claim (the row rewound, a timeline later) never gets its token issued again; tokens from before timelines, or from a restored higher timeline, still increase',
    () =>
      withSchema(async (schema, locks) => {
        const f = fixture();
        const { namespace, jobKey } = job();
        const timelineStep = 1n << 36n;
        const claim = async () => {
          const r = await locks.runWithLease(namespace, jobKey, (lease) => lease.token);
          if (!r.executed) throw new Error('the claim was not granted');
          return r.token;
        };
        const setRow = (token: bigint) =>
          f.observer.query(
            `UPDATE "${schema}".leases SET token = $3::int8 WHERE namespace = $1 AND job_key = $2`,
            [namespace, jobKey, String(token)],
          );
        // Tokens carry the timeline the server writes WAL on now (this one was not just
        // promoted, so the last checkpoint's timeline is current).
        const [server] = await f.observer.query<{ timeline: number }>(
          'SELECT timeline_id AS timeline FROM pg_control_checkpoint()',
        );
        const timeline = Number(server?.timeline);
        const t1 = await claim();
        const t2 = await claim();
        expect(tokenParts(t1)).toMatchObject({ timeline });
        expect(t2).toBe(t1 + 1n); // on one timeline, claims count up by one

        // A failover, with timelines shifted one down since this server cannot be promoted: the
        // old primary issued t1 then t2 on the timeline below this one; this server, promoted,
        // received t1's commits but not t2's.
        const lost = t2 - timelineStep;
        await setRow(t1 - timelineStep);
        const t3 = await claim();
        expect(t3).toBeGreaterThan(lost);
        expect(tokenParts(t3)).toEqual({ generation: 0, timeline, sequence: 0 });
        // The holder of the lost token — still running on the old side — cannot fence a write.
        const stale = await rejection(
          locks.withFencedWrite({ namespace, jobKey, token: lost }, () => 'written'),
        );
        expect(stale).toBeInstanceOf(LeaseLostError);
        expect(await claim()).toBe(t3 + 1n);

        // A row from before tokens carried timelines (a plain count) is taken over above it.
        await setRow(41n);
        expect(tokenParts(await claim())).toEqual({ generation: 0, timeline, sequence: 0 });
        // Tables restored or upgraded onto a cluster on a lower timeline than their tokens':
        // the generation rises, so tokens still grow.
        const restored = (BigInt(timeline) + 3n) * timelineStep + 7n;
        await setRow(restored);
        const t6 = await claim();
        expect(t6).toBeGreaterThan(restored);
        expect(tokenParts(t6)).toEqual({ generation: 1, timeline, sequence: 0 });
      }),
  );

  test(
    'leases.killed-holder-process',
    'killing the holder process mid-job: others skip until its lease expires, then one takes over',
    () =>
      withSchema(async (schema, locks) => {
        const f = fixture();
        const { namespace, jobKey } = job();
        const worker = spawn(
          process.execPath,
          [
            fileURLToPath(new URL('./lease-worker.mjs', import.meta.url)),
            JSON.stringify({
              module: workerModule,
              url: f.url,
              schema,
              namespace,
              jobKey,
              ttlMs: 1500,
            }),
          ],
          { stdio: ['ignore', 'pipe', 'inherit'] },
        );
        try {
          const claimed = await new Promise<bigint>((resolve, reject) => {
            let out = '';
            const timer = setTimeout(
              () => reject(new Error(`worker did not claim: ${out}`)),
              20_000,
            );
            worker.stdout?.on('data', (chunk: Buffer) => {
              out += chunk.toString();
              const match = /CLAIMED (\d+)/.exec(out);
              if (match) {
                clearTimeout(timer);
                resolve(BigInt(match[1] as string));
              } else if (/ERROR|NOT CLAIMED/.test(out)) {
                clearTimeout(timer);
                reject(new Error(out));
              }
            });
          });
          const whileAlive = await locks.runWithLease(namespace, jobKey, async () => 'no');
          expect(whileAlive).toMatchObject({ executed: false, holder: { token: claimed } });
          worker.kill('SIGKILL');
          await new Promise((r) => worker.once('exit', r));
          // The dead holder's last expiry, final now that its process is gone (a renewal it had
          // in flight died with its connection).
          const expiryOf = async () =>
            (
              await f.observer.query<{ expires_at: Date; claimed_at: Date }>(
                `SELECT expires_at, claimed_at FROM "${schema}".leases WHERE namespace = $1 AND job_key = $2`,
                [namespace, jobKey],
              )
            )[0];
          const deadExpiry = (await expiryOf())?.expires_at;
          let taken: LeaseResult<{ token: bigint; tookOver: boolean }> | undefined;
          const deadline = Date.now() + 15_000;
          while (Date.now() < deadline) {
            taken = await locks.runWithLease(namespace, jobKey, async (lease) => ({
              token: lease.token,
              tookOver: lease.tookOver,
            }));
            if (taken.executed) break;
            await sleep(100);
          }
          expect(taken).toMatchObject({
            executed: true,
            result: { token: claimed + 1n, tookOver: true },
          });
          // Nobody jumped in early: the takeover was claimed, on the database's clock, no sooner
          // than the dead holder's lease expired. (Judged on the database's clock, not by how
          // many tries were refused first: on a loaded machine this process may first ask after
          // the expiry.)
          const takeover = await expiryOf();
          expect(deadExpiry).toBeInstanceOf(Date);
          expect(takeover?.claimed_at.getTime()).toBeGreaterThanOrEqual(
            (deadExpiry as Date).getTime(),
          );
        } finally {
          if (worker.exitCode === null) worker.kill('SIGKILL');
        }
      }),
    60_000,
  );
}
