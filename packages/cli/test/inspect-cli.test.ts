/**
 * `lockkit locks`, `key`, `doctor` and the error paths, against real servers: a lock held by
 * another process is named, with its holder and its waiting contender; doctor flags a standby and
 * a pooler.
 */
import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { LockKey } from '@lockkit/core';
import { testDatabaseBaseUrl, testPgBouncer } from '@lockkit/test-db';
import { startEmbeddedPostgres } from '@lockkit/test-db/embedded';
import pg from 'pg';
import { afterEach, describe, expect, it } from 'vitest';

const cli = fileURLToPath(new URL('../dist/cli.mjs', import.meta.url));
const run = (args: string[]) =>
  spawnSync(process.execPath, [cli, ...args], {
    encoding: 'utf8',
    env: { ...process.env, DATABASE_URL: '' },
  });

const cleanups: (() => Promise<unknown> | unknown)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function holdInAnotherProcess(key: LockKey): Promise<{ pid: number; child: ChildProcess }> {
  const child = spawn(
    process.execPath,
    [
      fileURLToPath(new URL('./hold-lock.mjs', import.meta.url)),
      testDatabaseBaseUrl(),
      String(key.pair?.[0]),
      String(key.pair?.[1]),
    ],
    { stdio: ['pipe', 'pipe', 'inherit'] },
  );
  cleanups.push(
    () =>
      new Promise((r) => {
        if (child.exitCode !== null || child.signalCode !== null) return r(undefined);
        child.once('exit', r);
        child.stdin?.end();
      }),
  );
  const pid = await new Promise<number>((resolve) =>
    child.stdout?.once('data', (c: Buffer) => resolve(Number(c.toString()))),
  );
  return { pid, child };
}

describe('lockkit locks', () => {
  it('names a lock held by another process, its holder, and the contender waiting for it', async () => {
    const namespace = 'billing';
    const jobKey = `nightly-report-${Math.random().toString(36).slice(2, 8)}`;
    const key = LockKey.fromNames(namespace, jobKey);
    const holder = await holdInAnotherProcess(key);
    const waiter = new pg.Client({
      connectionString: testDatabaseBaseUrl(),
      application_name: 'lockkit-cli-test-waiter',
    });
    waiter.on('error', () => {});
    await waiter.connect();
    const waiting = waiter.query('SELECT pg_advisory_lock($1::int4, $2::int4)', [
      key.pair?.[0],
      key.pair?.[1],
    ]);
    cleanups.push(async () => {
      await waiting.catch(() => {});
      await waiter.end();
    });
    // Let the wait start before looking.
    await new Promise((r) => setTimeout(r, 300));

    const r = run([
      'locks',
      '--url',
      testDatabaseBaseUrl(),
      '--name',
      `${namespace}/${jobKey}`,
      '--json',
    ]);
    expect(r.stderr).toBe('');
    expect(r.status).toBe(0);
    const { locks, capacity } = JSON.parse(r.stdout) as {
      locks: {
        pid: number;
        names?: { namespace: string; jobKey: string };
        granted: boolean;
        blockedBy: number[];
        applicationName: string;
      }[];
      capacity: { slots: number; used: number };
    };
    const ours = locks.filter((l) => l.names?.jobKey === jobKey);
    expect(ours.find((l) => l.granted)).toMatchObject({
      pid: holder.pid,
      names: { namespace, jobKey },
      applicationName: 'lockkit-cli-test-holder',
    });
    expect(ours.find((l) => !l.granted)).toMatchObject({
      blockedBy: [holder.pid],
      applicationName: 'lockkit-cli-test-waiter',
    });
    expect(capacity.slots).toBeGreaterThan(capacity.used);

    const human = run([
      'locks',
      '--url',
      testDatabaseBaseUrl(),
      '--name',
      `${namespace}/${jobKey}`,
    ]);
    expect(human.stdout).toContain(`${namespace}/${jobKey}`);
    expect(human.stdout).toMatch(new RegExp(`WAITING\\s+\\d+\\s+${holder.pid}`));
    expect(human.stdout).toContain('lock table:');
    // Release: the holder's process lets go, the waiter gets it.
    holder.child.stdin?.end();
    await waiting;
    await waiter.query('SELECT pg_advisory_unlock_all()');
  });
});

describe('lockkit key', () => {
  it('prints both keys, the pg_locks coordinates and SQL, matching the compatibility vectors', () => {
    const r = run(['key', 'cron_jobs', 'generate_invoices', '--json']);
    expect(r.status).toBe(0);
    expect(JSON.parse(r.stdout)).toMatchObject({
      key1: -266172150,
      key2: 1646866057,
      pgLocks: { classid: 4028795146, objid: 1646866057, objsubid: 2 },
      sql: { tryInTransaction: 'SELECT pg_try_advisory_xact_lock(-266172150, 1646866057);' },
    });
    expect(run(['key', 'cron_jobs']).status).toBe(2);
    const bad = run(['key', '', 'x']);
    expect(bad.status).toBe(2);
    expect(bad.stderr).toMatch(/^lockkit: KEY_EMPTY: /);
  });
});

describe('lockkit doctor', () => {
  it('passes a healthy primary (warnings allowed), as JSON too', () => {
    const r = run(['doctor', '--url', testDatabaseBaseUrl(), '--json']);
    expect(r.status).toBe(0);
    const checks = JSON.parse(r.stdout) as { id: string; level: string }[];
    expect(checks.find((c) => c.id === 'standby')).toMatchObject({ level: 'ok' });
    expect(checks.find((c) => c.id === 'pooler')).toMatchObject({ level: 'ok' });
    expect(checks.find((c) => c.id === 'clock')).toMatchObject({ level: 'ok' });
    // Who the server is, and that its advisory locks are real (two sessions on doctor's pool).
    expect(checks.find((c) => c.id === 'server')).toMatchObject({
      level: 'ok',
      message: expect.stringMatching(
        /^PostgreSQL \d+.*; system identifier \d+; timeline \d+ \(as of the last checkpoint\)\.$/,
      ),
    });
    expect(checks.find((c) => c.id === 'engine-self-test')).toMatchObject({
      level: 'ok',
      message: expect.stringMatching(/^Advisory locks are real: a second session/),
    });
    const human = run(['doctor', '--url', testDatabaseBaseUrl()]);
    expect(human.stdout).toMatch(
      / ok\s+server\s+PostgreSQL \d+.*system identifier \d+; timeline \d+/,
    );
  });

  it('fails on stub advisory-lock functions that lock nothing, naming what it saw', async () => {
    // Stubs ahead of pg_catalog on the search_path: the unqualified names resolve to them.
    const schema = `lockkit_stub_${Math.random().toString(36).slice(2, 10)}`;
    const admin = new pg.Client({ connectionString: testDatabaseBaseUrl() });
    await admin.connect();
    cleanups.push(async () => {
      await admin.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
      await admin.end();
    });
    await admin.query(`CREATE SCHEMA ${schema}`);
    for (const args of ['int4, int4', 'int8'])
      await admin.query(
        `CREATE FUNCTION ${schema}.pg_try_advisory_xact_lock(${args}) RETURNS boolean LANGUAGE sql AS 'SELECT true'`,
      );
    const url = new URL(testDatabaseBaseUrl());
    url.searchParams.set('options', `-c search_path=${schema},pg_catalog`);
    const r = run(['doctor', '--url', url.toString()]);
    expect(r.status).toBe(1);
    expect(r.stdout).toMatch(
      /FAIL\s+engine-self-test\s+Advisory locks are not real on this server: a second session took the same lock; the lock is not in pg_locks/,
    );
  });

  it('fails on a standby, saying to use the primary', async () => {
    const standby = await startEmbeddedPostgres({ standby: true });
    cleanups.push(() => standby.stop());
    const r = run(['doctor', '--url', standby.url]);
    expect(r.status).toBe(1);
    expect(r.stdout).toMatch(/FAIL\s+standby\s+The server is a standby.*primary/);
  }, 60_000);

  it.runIf('url' in testPgBouncer())('warns of a transaction pooler in the path', () => {
    const bouncer = testPgBouncer() as { url: string };
    const r = run(['doctor', '--url', bouncer.url]);
    expect(r.status).toBe(0);
    expect(r.stdout).toMatch(/WARN\s+pooler\s+A transaction pooler is in the path/);
    expect(r.stdout).toMatch(/transactionPooler: true/);
  });

  it.runIf('url' in testPgBouncer())(
    'finds a session-mode pooler safe for session locks, and recommends nothing',
    () => {
      const bouncer = testPgBouncer() as { sessionModeUrl: string };
      const r = run(['doctor', '--url', bouncer.sessionModeUrl, '--json']);
      expect(r.status).toBe(0);
      const pooler = (
        JSON.parse(r.stdout) as { id: string; level: string; message: string }[]
      ).find((c) => c.id === 'pooler');
      expect(pooler).toMatchObject({ level: 'ok', message: expect.stringMatching(/session mode/) });
      expect(pooler?.message).not.toMatch(/transactionPooler: true/);
    },
  );
});

describe('bad input', () => {
  it('answers every mistake with one clear line and a non-zero exit, no stack trace', () => {
    const cases: [string[], number, RegExp][] = [
      [['frobnicate'], 2, /^lockkit: unknown command "frobnicate"/],
      [['locks'], 2, /^lockkit: no database: pass --url or set DATABASE_URL/],
      [['locks', '--url', 'not a url'], 2, /^lockkit: --url is not a valid URL/],
      [
        ['locks', '--url', 'postgres://postgres:s3cret@127.0.0.1:1/test'],
        1,
        /^lockkit: cannot reach the server at postgres:\/\/postgres:\*\*\*@127\.0\.0\.1:1\/test \(ECONNREFUSED\)/,
      ],
      [
        [
          'locks',
          '--url',
          testDatabaseBaseUrl().replace(/\/[^/?]+(\?|$)/, '/lockkit_no_such_db$1'),
        ],
        1,
        /^lockkit: the database in .* does not exist/,
      ],
      [
        ['migrate', '--url', testDatabaseBaseUrl(), '--schema', 'x;y'],
        2,
        /^lockkit: OPTION_INVALID: /,
      ],
    ];
    for (const [args, status, message] of cases) {
      const r = run(args);
      expect(r.status, args.join(' ')).toBe(status);
      expect(r.stderr, args.join(' ')).toMatch(message);
      expect(r.stderr.trim().split('\n').length, args.join(' ')).toBe(1);
      expect(r.stderr).not.toContain('s3cret');
      expect(r.stderr).not.toMatch(/\n\s+at /);
    }
  });
});

describe('lockkit dashboard', () => {
  it('refuses a non-loopback host without a token', () => {
    const r = run(['dashboard', '--url', testDatabaseBaseUrl(), '--host', '0.0.0.0']);
    expect(r.status).toBe(2);
    expect(r.stderr).toMatch(/^lockkit: --host 0\.0\.0\.0 is not loopback: pass --token/);
  });

  it('serves the page and the state, and checks the token when it has one', async () => {
    const { startDashboard } = await import('../src/dashboard.js');
    const { pgExecutor } = await import('@lockkit/pg');
    const pool = new pg.Pool({ connectionString: testDatabaseBaseUrl(), max: 2 });
    cleanups.push(() => pool.end());
    const dashboard = await startDashboard({
      executor: pgExecutor(pool),
      port: 0,
      token: 's3cret',
    });
    cleanups.push(() => dashboard.close());
    const base = new URL(dashboard.url);
    expect((await fetch(new URL('/', base.origin))).status).toBe(401);
    const page = await fetch(dashboard.url);
    expect(page.status).toBe(200);
    expect(await page.text()).toContain('<h1>lockkit dashboard</h1>');
    const state = await fetch(new URL('/api/state', base.origin), {
      headers: { authorization: 'Bearer s3cret' },
    });
    expect(state.status).toBe(200);
    expect(await state.json()).toMatchObject({
      capacity: { slots: expect.any(Number) },
      locks: expect.any(Array),
    });
  });
});

describe('lockkit leases, runs and watch', () => {
  it('show a held lease, the scheduler ledger, and the refreshed locks view', async () => {
    const { createLockClient, createScheduler } = await import('@lockkit/core');
    const { pgExecutor } = await import('@lockkit/pg');
    const schema = `lockkit_cli_views_${Math.random().toString(36).slice(2, 8)}`;
    const pool = new pg.Pool({ connectionString: testDatabaseBaseUrl(), max: 4 });
    cleanups.push(async () => {
      await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
      await pool.end();
    });
    const locks = createLockClient(pgExecutor(pool), { schema });
    await locks.migrate();
    // A finished tick and a failed one in the ledger, through the real scheduler.
    const scheduler = createScheduler(locks);
    scheduler.register('nightly', '* * * * * *', async (run) => {
      if (run.tick.getSeconds() % 2 === 0) throw new Error('even seconds fail');
    });
    await scheduler.start();
    await new Promise((r) => setTimeout(r, 2300));
    await scheduler.stop();
    const url = testDatabaseBaseUrl();
    await locks.runWithLease(
      'exports',
      'monthly',
      async (lease) => {
        const leases = run(['leases', '--url', url, '--schema', schema]);
        expect(leases.status).toBe(0);
        // The token as the number it is (the first claim on the server's timeline).
        expect(leases.stdout).toMatch(
          new RegExp(`exports/monthly\\s+${lease.token}\\s+IN_PROGRESS\\s+yes`),
        );
        const json = JSON.parse(
          run(['leases', '--url', url, '--schema', schema, '--json']).stdout,
        ) as { held: boolean; token: string }[];
        expect(json).toEqual([expect.objectContaining({ held: true, token: String(lease.token) })]);
      },
      { heartbeat: false, ttlMs: 20_000 },
    );
    const runs = run(['runs', '--url', url, '--schema', schema]);
    expect(runs.status).toBe(0);
    expect(runs.stdout).toMatch(/nightly\s+\S+/);
    expect(runs.stdout).toMatch(/SUCCEEDED|FAILED/);
    const summary = JSON.parse(
      run(['runs', '--url', url, '--schema', schema, '--json']).stdout,
    ) as { jobs: { job: string; total: number }[] };
    expect(summary.jobs).toEqual([
      expect.objectContaining({ job: 'nightly', total: expect.any(Number) }),
    ]);
    expect(summary.jobs[0]?.total).toBeGreaterThanOrEqual(2);
    const watch = run(['watch', '--url', url, '--interval', '100', '--iterations', '2']);
    expect(watch.status).toBe(0);
    expect(watch.stdout.match(/lock table:/g)).toHaveLength(2);
  }, 30_000);
});

describe('lockkit runs: what counts as a run', () => {
  it('counts ticks that ran, not MISSED or SKIPPED_OVERLAP rows', async () => {
    const { migrate } = await import('@lockkit/core');
    const { pgExecutor } = await import('@lockkit/pg');
    const schema = `lockkit_cli_runs_${Math.random().toString(36).slice(2, 8)}`;
    const pool = new pg.Pool({ connectionString: testDatabaseBaseUrl(), max: 2 });
    cleanups.push(async () => {
      await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
      await pool.end();
    });
    await migrate(pgExecutor(pool), { schema });
    // 2 succeeded, 1 failed, 1 abandoned: 4 runs; 3 missed and 2 skipped ticks were not runs.
    const statuses = [
      'SUCCEEDED',
      'MISSED',
      'FAILED',
      'MISSED',
      'SKIPPED_OVERLAP',
      'ABANDONED',
      'MISSED',
      'SKIPPED_OVERLAP',
      'SUCCEEDED',
    ];
    for (const [i, status] of statuses.entries()) {
      await pool.query(
        `INSERT INTO "${schema}".runs (job, tick, status, owner) VALUES ('billing', now() - make_interval(secs => $1), $2, 'host-a:42')`,
        [statuses.length - i, status],
      );
    }
    const url = testDatabaseBaseUrl();
    const json = JSON.parse(run(['runs', '--url', url, '--schema', schema, '--json']).stdout) as {
      jobs: { job: string; ran: number; missed: number; skippedOverlap: number }[];
    };
    expect(json.jobs).toEqual([
      expect.objectContaining({ job: 'billing', ran: 4, missed: 3, skippedOverlap: 2 }),
    ]);
    const human = run(['runs', '--url', url, '--schema', schema]);
    expect(human.status).toBe(0);
    const [header, , row] = human.stdout.split('\n');
    const columns = (header as string).split(/\s{2,}/);
    const cells = (row as string).split(/\s{2,}/);
    expect(cells[columns.indexOf('runs')]).toBe('4');
    expect(cells[columns.indexOf('missed')]).toBe('3');
    // Who ran the latest ticks is shown.
    expect(human.stdout).toContain('host-a:42');
  });
});
