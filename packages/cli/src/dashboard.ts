/**
 * `lockkit dashboard`: a small web page of live advisory locks (decoded names, holders, waiters),
 * leases, and the runs ledger as a timeline per job, pushed every second over server-sent events.
 * Bound to 127.0.0.1 unless told otherwise; any other host requires a token.
 */
import { timingSafeEqual } from 'node:crypto';
import { createServer, type Server } from 'node:http';
import { inspect, type KeyNames, type LockExecutor } from '@lockkit/core';
import { DASHBOARD_PAGE } from './dashboard-page.js';

/** Options of {@link startDashboard}. */
export interface DashboardOptions {
  readonly executor: LockExecutor;
  readonly schema?: string;
  readonly names?: KeyNames;
  /** Default 127.0.0.1. Any other host requires `token`. */
  readonly host?: string;
  /** Default 4680; 0 picks a free port. */
  readonly port?: number;
  /** Required for a non-loopback host: clients pass `?token=` or `Authorization: Bearer`. */
  readonly token?: string;
  /** How often the page is refreshed, in ms (default 1000). */
  readonly intervalMs?: number;
}

/** A running dashboard. */
export interface Dashboard {
  readonly url: string;
  close(): Promise<void>;
}

const LOOPBACK = new Set(['127.0.0.1', 'localhost', '::1']);
const json = (value: unknown) =>
  JSON.stringify(value, (_k, v) => (typeof v === 'bigint' ? String(v) : v));

/** Starts the dashboard's HTTP server. */
export async function startDashboard(options: DashboardOptions): Promise<Dashboard> {
  const host = options.host ?? '127.0.0.1';
  if (!LOOPBACK.has(host) && !options.token) {
    throw new Error(
      `the dashboard binds ${host}, which is not loopback: pass --token to protect it`,
    );
  }
  const intervalMs = options.intervalMs ?? 1000;
  const snapshot = async () =>
    json(
      await inspect(options.executor, {
        ...(options.schema !== undefined && { schema: options.schema }),
        ...(options.names && { names: options.names }),
      }),
    );
  const authorised = (url: URL, header: string | undefined): boolean => {
    if (!options.token) return true;
    const given = url.searchParams.get('token') ?? header?.replace(/^Bearer\s+/i, '') ?? '';
    const a = Buffer.from(given);
    const b = Buffer.from(options.token);
    return a.length === b.length && timingSafeEqual(a, b);
  };
  const streams = new Set<() => void>();
  const server: Server = createServer((request, response) => {
    const url = new URL(request.url ?? '/', 'http://dashboard');
    if (!authorised(url, request.headers.authorization)) {
      response.writeHead(401, { 'content-type': 'text/plain' }).end('a token is required\n');
      return;
    }
    if (url.pathname === '/') {
      response
        .writeHead(200, { 'content-type': 'text/html; charset=utf-8', 'cache-control': 'no-store' })
        .end(DASHBOARD_PAGE);
    } else if (url.pathname === '/api/state') {
      snapshot().then(
        (body) => response.writeHead(200, { 'content-type': 'application/json' }).end(body),
        (error: unknown) =>
          response.writeHead(500, { 'content-type': 'text/plain' }).end(`${String(error)}\n`),
      );
    } else if (url.pathname === '/events') {
      response.writeHead(200, {
        'content-type': 'text/event-stream',
        'cache-control': 'no-store',
        connection: 'keep-alive',
      });
      let timer: NodeJS.Timeout | undefined;
      const push = async () => {
        try {
          response.write(`data: ${await snapshot()}\n\n`);
        } catch (error) {
          response.write(`event: failure\ndata: ${json(String(error))}\n\n`);
        }
        if (!response.writableEnded) timer = setTimeout(push, intervalMs);
      };
      const stop = () => {
        clearTimeout(timer);
        streams.delete(stop);
        response.end();
      };
      streams.add(stop);
      request.on('close', stop);
      void push();
    } else {
      response.writeHead(404, { 'content-type': 'text/plain' }).end('not found\n');
    }
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
        for (const stop of streams) stop();
        server.close(() => resolve());
      }),
  };
}
