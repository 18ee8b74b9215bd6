/**
 * `lockkit dashboard`: a small web page of the advisory locks held in the last seconds (decoded
 * names, holders and their application names, waiters), leases and their holders, each scheduled
 * job's last runs and who ran them, and the recent runs — rendered on the server, so the first
 * HTML already shows them, then refreshed over server-sent events.
 *
 * Hardening: bound to 127.0.0.1 unless told otherwise (any other address requires a token);
 * without a token it answers only requests whose Host header names a loopback host, so a page on
 * another site cannot read it through DNS rebinding; one shared snapshot per interval, whatever
 * the number of pages; a Content-Security-Policy that allows only its own script.
 */
import { randomBytes, timingSafeEqual } from 'node:crypto';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { type KeyNames, type LockExecutor, LockKey } from '@lockkit/core';
import { DashboardFeed, type DashboardSnapshot } from './dashboard-feed.js';
import { renderPage } from './dashboard-page.js';
import { renderLoading, renderMain } from './dashboard-view.js';

/** Options of {@link startDashboard}. */
export interface DashboardOptions {
  readonly executor: LockExecutor;
  /** Schema of lockkit's tables (default `lockkit`). */
  readonly schema?: string;
  /** Extra names to decode lock keys with (leases and scheduled jobs decode on their own). */
  readonly names?: KeyNames;
  /** Default 127.0.0.1. Any other address requires `token`. */
  readonly host?: string;
  /** Default 4680; 0 picks a free port. */
  readonly port?: number;
  /**
   * Clients pass `?token=` or `Authorization: Bearer`. Required for a non-loopback `host`; with
   * it, any Host header is answered (the token is the guard), without it only loopback ones.
   */
  readonly token?: string;
  /** How often the full snapshot (locks, leases, ledger) is taken, in ms (default 1000). */
  readonly intervalMs?: number;
  /** How often `pg_locks` is sampled for the recent-locks view, in ms (default 200). */
  readonly sampleMs?: number;
  /** How long a lock stays in the recent-locks view after it was last seen, in s (default 60). */
  readonly historySeconds?: number;
}

/** A running dashboard. */
export interface Dashboard {
  readonly url: string;
  close(): Promise<void>;
}

const LOOPBACK = new Set(['127.0.0.1', 'localhost', '::1']);
/**
 * How long the database loops keep going after the last request when no page listens. They start
 * with the server, so that the first page already has a history of the locks that came and went.
 */
const IDLE_MS = 10 * 60_000;
/** How long a request waits for the first snapshot before the page says it is loading. */
const FIRST_SNAPSHOT_WAIT_MS = 5000;

/**
 * Whether a Host header names this machine: `localhost` (and `*.localhost`), `127.x.x.x`, `[::1]`,
 * with an optional port. DNS rebinding makes a foreign name resolve here; the name stays foreign.
 */
export function isLoopbackHost(header: string | undefined): boolean {
  if (!header) return false;
  const match = /^(?:\[([^\]]+)\]|([^:[\]]+))(?::\d{1,5})?$/.exec(header.trim());
  if (!match) return false;
  const name = (match[1] ?? match[2] ?? '').toLowerCase().replace(/\.$/, '');
  return (
    name === 'localhost' ||
    name.endsWith('.localhost') ||
    name === '::1' ||
    /^127(\.(25[0-5]|2[0-4]\d|1?\d?\d)){3}$/.test(name)
  );
}

const json = (value: unknown) =>
  JSON.stringify(value, (_k, v) =>
    typeof v === 'bigint' ? String(v) : v instanceof LockKey ? String(v) : v,
  );

function positive(value: number | undefined, fallback: number, what: string): number {
  const n = value ?? fallback;
  if (!Number.isInteger(n) || n < 1)
    throw new Error(`${what} must be a positive integer, got ${n}`);
  return n;
}

/** Starts the dashboard's HTTP server. */
export async function startDashboard(options: DashboardOptions): Promise<Dashboard> {
  const host = options.host ?? '127.0.0.1';
  if (!LOOPBACK.has(host) && !options.token) {
    throw new Error(
      `the dashboard binds ${host}, which is not loopback: pass --token to protect it`,
    );
  }
  const intervalMs = positive(options.intervalMs, 1000, 'intervalMs');
  const feed = new DashboardFeed({
    executor: options.executor,
    schema: options.schema ?? 'lockkit',
    names: options.names,
    intervalMs,
    sampleMs: positive(options.sampleMs, 200, 'sampleMs'),
    historySeconds: positive(options.historySeconds, 60, 'historySeconds'),
    idleMs: IDLE_MS,
  });
  feed.start();
  // Rendered once per snapshot, however many pages receive it.
  let rendered: { snapshot: DashboardSnapshot; html: string } | undefined;
  const render = (snapshot: DashboardSnapshot | undefined): string => {
    if (!snapshot) return renderLoading(feed.error);
    if (rendered?.snapshot !== snapshot) rendered = { snapshot, html: renderMain(snapshot) };
    return rendered.html;
  };

  const authorised = (url: URL, request: IncomingMessage): boolean => {
    if (!options.token) return isLoopbackHost(request.headers.host);
    const given =
      url.searchParams.get('token') ??
      request.headers.authorization?.replace(/^Bearer\s+/i, '') ??
      '';
    const a = Buffer.from(given);
    const b = Buffer.from(options.token);
    return a.length === b.length && timingSafeEqual(a, b);
  };
  const streams = new Set<() => void>();

  const page = async (response: ServerResponse) => {
    const snapshot = await feed.current(FIRST_SNAPSHOT_WAIT_MS, 2 * intervalMs);
    const nonce = randomBytes(16).toString('base64');
    response
      .writeHead(200, {
        'content-type': 'text/html; charset=utf-8',
        'cache-control': 'no-store',
        'content-security-policy': `default-src 'none'; script-src 'nonce-${nonce}'; style-src 'unsafe-inline'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'`,
        'x-content-type-options': 'nosniff',
        'referrer-policy': 'no-referrer',
      })
      .end(renderPage(render(snapshot), nonce));
  };

  const state = async (response: ServerResponse) => {
    const snapshot = await feed.current(FIRST_SNAPSHOT_WAIT_MS);
    if (!snapshot) {
      response.writeHead(503, { 'content-type': 'text/plain' }).end('loading, try again\n');
      return;
    }
    const { inspection: i } = snapshot;
    response
      .writeHead(200, { 'content-type': 'application/json', 'cache-control': 'no-store' })
      .end(
        json({
          at: new Date(snapshot.at),
          schema: snapshot.schema,
          error: snapshot.error ?? null,
          locks: i.locks,
          capacity: i.capacity,
          leases: i.leases,
          jobs: i.jobs,
          recentRuns: i.recentRuns,
          recentLocks: snapshot.recentLocks,
          historySeconds: snapshot.historySeconds,
        }),
      );
  };

  const events = (request: IncomingMessage, response: ServerResponse) => {
    response.writeHead(200, {
      'content-type': 'text/event-stream',
      'cache-control': 'no-store',
      connection: 'keep-alive',
    });
    const send = (snapshot: DashboardSnapshot) => {
      response.write(`data: ${JSON.stringify({ html: render(snapshot) })}\n\n`);
    };
    const unsubscribe = feed.subscribe(send);
    void feed.current(0).then((snapshot) => {
      if (snapshot && !response.writableEnded) send(snapshot);
    });
    const stop = () => {
      unsubscribe();
      streams.delete(stop);
      response.end();
    };
    streams.add(stop);
    request.on('close', stop);
  };

  const server: Server = createServer((request, response) => {
    const url = new URL(request.url ?? '/', 'http://dashboard');
    if (!authorised(url, request)) {
      if (options.token) {
        response.writeHead(401, { 'content-type': 'text/plain' }).end('a token is required\n');
      } else {
        response
          .writeHead(403, { 'content-type': 'text/plain' })
          .end(
            'this dashboard answers requests for localhost, 127.0.0.1 or [::1] only (start it with --token to serve other names)\n',
          );
      }
      return;
    }
    const failed = (error: unknown) => {
      if (!response.headersSent)
        response.writeHead(500, { 'content-type': 'text/plain' }).end(`${String(error)}\n`);
    };
    if (url.pathname === '/') page(response).catch(failed);
    else if (url.pathname === '/api/state') state(response).catch(failed);
    else if (url.pathname === '/events') events(request, response);
    else response.writeHead(404, { 'content-type': 'text/plain' }).end('not found\n');
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(options.port ?? 4680, host, () => resolve());
  });
  const address = server.address();
  const port = typeof address === 'object' && address ? address.port : options.port;
  const shownHost = host.includes(':') ? `[${host}]` : host;
  return {
    url: `http://${shownHost}:${port}/${options.token ? `?token=${encodeURIComponent(options.token)}` : ''}`,
    close: () =>
      new Promise<void>((resolve) => {
        feed.close();
        for (const stop of streams) stop();
        server.close(() => resolve());
      }),
  };
}
