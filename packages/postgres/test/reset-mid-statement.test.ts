// A link reset (RST) while a lockkit task's statement runs: Node reports the socket's error at
// once and its close only later (in the event loop's close phase). The statement fails with
// ECONNRESET in between, and the call ends; lockkit must then send nothing more on that connection.
// It used to "end its backend" (ROLLBACK, RESET ROLE, pg_terminate_backend(pg_backend_pid())) as if
// the connection might still be open: those statements went out after postgres.js had reconnected
// the slot for another request — terminating that request's backend — or onto a closed socket, which
// crashes the process from a timer (`TypeError: Cannot read properties of null (reading 'write')`,
// seen in `pnpm chaos --adapter postgres`, whose drop fault resets links).
//
// Deterministic: the proxy holds the task statement's reply; the link is reset while it is held.
import { startRoundTripProxy } from '@lockkit/conformance';
import { createLockClient, LockKey } from '@lockkit/core';
import { testDatabaseUrl } from '@lockkit/test-db';
import postgres from 'postgres';
import { expect, it } from 'vitest';
import { postgresExecutor } from '../src/index.js';
import { startFrontProxy } from './front-proxy.js';

it('a link reset mid-statement: nothing more is sent for that call, nothing goes uncaught, the pool goes on', async () => {
  const problems: unknown[] = [];
  const onProblem = (error: unknown) => problems.push(error);
  process.on('unhandledRejection', onProblem);
  process.on('uncaughtException', onProblem);
  const proxy = await startRoundTripProxy(testDatabaseUrl());
  const front = await startFrontProxy(proxy.url);
  const sql = postgres(front.url, { max: 2, onnotice: () => {} });
  try {
    const locks = createLockClient(postgresExecutor(sql as never), { engineSelfTest: false });
    await locks.withLock(LockKey.fromNames('reset', 'warm'), async () => undefined);
    const wire = proxy.record();
    const trap = proxy.trapStatement(1, 'hold-reply');
    const call = locks
      .withLock(LockKey.fromNames('reset', 'call'), async (_t, ctx) => {
        await ctx.query('SELECT 42 AS answer');
      })
      .then(
        () => 'ran',
        (error: { code?: string }) => `rejected ${error.code ?? String(error)}`,
      );
    expect((await trap.fired).text).toContain('SELECT 42');
    // Every client link the pool has: reset.
    front.resetAll();
    trap.release();
    expect(await call).toBe('rejected CONNECTION_LOST');
    // The pool goes on: a call runs.
    expect(await locks.withLock(LockKey.fromNames('reset', 'after'), async () => 7)).toEqual({
      executed: true,
      result: 7,
    });
    await new Promise((resolve) => setTimeout(resolve, 100));
    const sent = wire.stop().map((s) => s.text);
    expect(
      sent.filter((t) => /pg_terminate_backend|RESET ROLE|SET SESSION AUTHORIZATION/i.test(t)),
    ).toEqual([]);
    expect(problems).toEqual([]);
  } finally {
    process.off('unhandledRejection', onProblem);
    process.off('uncaughtException', onProblem);
    await sql.end({ timeout: 1 });
    await front.close();
    await proxy.close();
  }
}, 30_000);
