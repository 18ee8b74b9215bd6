/**
 * The dashboard's server against a real Postgres: it answers loopback Host names only (unless a
 * token guards it), its database work does not grow with the pages that poll it, its first HTML
 * already carries the data, and it remembers the locks it saw over the last seconds.
 */
import { randomBytes } from 'node:crypto';
import { request } from 'node:http';
import { createLockClient, KeyNames, type LockExecutor, LockKey, migrate } from '@lockkit/core';
import { pgExecutor } from '@lockkit/pg';
import { testDatabaseBaseUrl } from '@lockkit/test-db';
import pg from 'pg';
import { afterEach, describe, expect, it } from 'vitest';
import { type Dashboard, startDashboard } from '../src/dashboard.js';

const cleanups: (() => Promise<unknown> | unknown)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

function poolOf(applicationName = 'lockkit-dashboard-test'): pg.Pool {
  const pool = new pg.Pool({
    connectionString: testDatabaseBaseUrl(),
    max: 3,
    application_name: applicationName,
  });
  pool.on('error', () => {});
  cleanups.push(() => pool.end());
  return pool;
}

async function start(options: Partial<Parameters<typeof startDashboard>[0]> = {}) {
  const dashboard = await startDashboard({ executor: pgExecutor(poolOf()), port: 0, ...options });
  cleanups.push(() => dashboard.close());
  return dashboard;
}

/** A GET with any Host header (fetch will not send a foreign one); `null`: none at all. */
function get(
  dashboard: Dashboard,
  path: string,
  host: string | null,
): Promise<{ status: number; body: string }> {
  const url = new URL(dashboard.url);
  return new Promise((resolve, reject) => {
    const req = request(
      {
        hostname: url.hostname,
        port: url.port,
        path,
        headers: host === null ? {} : { host },
        setHost: false,
      },
      (res) => {
        let body = '';
        res.on('data', (c: Buffer) => {
          body += c.toString();
        });
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
      },
    );
    req.on('error', reject);
    req.end();
  });
}

describe('the dashboard and Host headers (DNS rebinding)', () => {
  it('answers loopback names and refuses any other Host, reading nothing', async () => {
    const dashboard = await start();
    const port = new URL(dashboard.url).port;
    for (const host of [`127.0.0.1:${port}`, `localhost:${port}`, `[::1]:${port}`]) {
      expect((await get(dashboard, '/api/state', host)).status, host).toBe(200);
    }
    for (const host of [
      `attacker.example:${port}`,
      `127.0.0.1.attacker.example:${port}`,
      `localhost.attacker.example:${port}`,
      null,
    ]) {
      // 403 from the dashboard; with no Host at all, Node's own 400 comes first.
      const refused = host === null ? 400 : 403;
      const r = await get(dashboard, '/api/state', host);
      expect(r.status, String(host)).toBe(refused);
      expect(r.body).not.toContain('capacity');
      expect((await get(dashboard, '/', host)).status, String(host)).toBe(refused);
      expect((await get(dashboard, '/events', host)).status, String(host)).toBe(refused);
    }
  });

  it('with a token, any Host may ask, and only with the token', async () => {
    const dashboard = await start({ token: 's3cret' });
    const port = new URL(dashboard.url).port;
    const foreign = `dashboard.internal:${port}`;
    expect((await get(dashboard, '/api/state', foreign)).status).toBe(401);
    expect((await get(dashboard, '/api/state?token=s3cret', foreign)).status).toBe(200);
  });
});

describe('the dashboard’s database work', () => {
  it('is one shared snapshot per interval, however many pages poll', async () => {
    const pool = poolOf();
    const real = pgExecutor(pool);
    const statements: string[] = [];
    const counting: LockExecutor = {
      ...real,
      transaction: (fn) =>
        real.transaction((ctx) =>
          fn({
            ...ctx,
            query: (text, params) => {
              statements.push(text);
              return ctx.query(text, params);
            },
          }),
        ),
    };
    const dashboard = await startDashboard({
      executor: counting,
      port: 0,
      intervalMs: 300,
      sampleMs: 100,
    });
    cleanups.push(() => dashboard.close());
    const started = performance.now();
    // Six pages on the event stream, and forty state requests meanwhile.
    const streams = Array.from({ length: 6 }, () => new AbortController());
    cleanups.push(() => {
      for (const s of streams) s.abort();
    });
    for (const s of streams) {
      void fetch(new URL('events', dashboard.url), { signal: s.signal }).then(
        (r) => r.body?.pipeTo(new WritableStream()).catch(() => {}),
        () => {},
      );
    }
    for (let i = 0; i < 4; i++) {
      await Promise.all(
        Array.from({ length: 10 }, () =>
          fetch(new URL('api/state', dashboard.url)).then((r) => r.text()),
        ),
      );
      await new Promise((r) => setTimeout(r, 200));
    }
    const elapsed = performance.now() - started;
    const inspections = statements.filter((s) => s.includes('pg_blocking_pids')).length;
    const samples = statements.filter(
      (s) => s.includes('pg_locks') && !s.includes('pg_blocking_pids') && !s.includes('fastpath'),
    ).length;
    // Snapshots are taken one after another, at least an interval apart: pages never add any.
    expect(inspections).toBeGreaterThan(0);
    expect(inspections).toBeLessThanOrEqual(Math.floor(elapsed / 300) + 2); // + the one at start
    expect(samples).toBeLessThanOrEqual(Math.floor(elapsed / 100) + 2);
  });
});

describe('the dashboard with its database down', () => {
  it('says so at once instead of hanging, and serves no stale state', async () => {
    const down = new pg.Pool({ connectionString: 'postgres://postgres@127.0.0.1:1/none', max: 1 });
    down.on('error', () => {});
    cleanups.push(() => down.end());
    const dashboard = await startDashboard({ executor: pgExecutor(down), port: 0 });
    cleanups.push(() => dashboard.close());
    const started = performance.now();
    const page = await fetch(dashboard.url);
    expect(page.status).toBe(200);
    expect(await page.text()).toMatch(/could not be read[\s\S]*ECONNREFUSED/);
    expect(performance.now() - started).toBeLessThan(4000); // not the 5 s wait for a first snapshot
    expect((await fetch(new URL('api/state', dashboard.url))).status).toBe(503);
  });
});

describe('what the dashboard shows', () => {
  it('renders recent runs, who ran them, leases with their holder, and recently held locks in its first HTML', async () => {
    const schema = `lockkit_dash_${randomBytes(4).toString('hex')}`;
    const pool = poolOf();
    cleanups.push(() => pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`));
    await migrate(pgExecutor(pool), { schema });
    for (const [i, status] of ['SUCCEEDED', 'FAILED', 'MISSED', 'SUCCEEDED'].entries()) {
      await pool.query(
        `INSERT INTO "${schema}".runs (job, tick, status, owner, started_at, finished_at, error)
         VALUES ('invoices', now() - make_interval(secs => $1), $2, $3,
                 now() - make_interval(secs => $1), now() - make_interval(secs => $1) + interval '42 ms', $4)`,
        [
          10 - i,
          status,
          status === 'MISSED' ? null : `worker-${i}`,
          status === 'FAILED' ? 'boom <b>' : null,
        ],
      );
    }
    const key = LockKey.fromNames('billing', `close-${randomBytes(3).toString('hex')}`);
    const names = new KeyNames().add('billing', key.names?.jobKey as string);
    const dashboard = await start({ schema, names, intervalMs: 200, sampleMs: 50 });
    // A transaction lock held by an application named "billing-worker", then released.
    const holder = new pg.Client({
      connectionString: testDatabaseBaseUrl(),
      application_name: 'billing-worker',
    });
    await holder.connect();
    cleanups.push(() => holder.end());
    const locks = createLockClient(pgExecutor(holder), { schema });
    await locks.withLock(key, async () => {
      // Held until the dashboard has seen it: no sleep, no timing window.
      for (;;) {
        const state = (await (await fetch(new URL('api/state', dashboard.url))).json()) as {
          recentLocks: { key: string }[];
        };
        if (state.recentLocks.some((l) => l.key === `(${key.pair?.join(',')})`)) break;
        await new Promise((r) => setTimeout(r, 25));
      }
    });
    /** The page's first HTML, once the snapshot behind it shows what `ready` wants. */
    const pageWhen = async (ready: (state: { leases: { jobKey: string }[] }) => boolean) => {
      for (;;) {
        const state = (await (await fetch(new URL('api/state', dashboard.url))).json()) as {
          leases: { jobKey: string }[];
        };
        if (ready(state)) return (await fetch(dashboard.url)).text();
        await new Promise((r) => setTimeout(r, 25));
      }
    };
    await locks.runWithLease(
      'exports',
      'monthly',
      async (lease) => {
        const html = await pageWhen((state) => state.leases.some((l) => l.jobKey === 'monthly'));
        // Recent runs and who ran them, as text (not only in a tooltip); errors escaped.
        expect(html).toMatch(/<table[^>]*id="runs"/);
        expect(html).toContain('worker-0');
        expect(html).toContain('worker-3');
        expect(html).toContain('SUCCEEDED');
        expect(html).toContain('boom &lt;b&gt;');
        expect(html).not.toContain('boom <b>');
        // The lease and its holder.
        expect(html).toContain('exports/monthly');
        expect(html).toMatch(
          new RegExp(
            `exports/monthly</td><td><span class="held">held</span></td><td class="holder">${lease.owner}<`,
          ),
        );
        return undefined;
      },
      { heartbeat: false },
    );
    const html = await (await fetch(dashboard.url)).text();
    // The lock, no longer held, is still listed with its holder's application name.
    const row = new RegExp(`${key.names?.namespace}/${key.names?.jobKey}[\\s\\S]*?billing-worker`);
    expect(html).toMatch(row);
    expect(html).toMatch(/in the last 60 s/);
  });
});
