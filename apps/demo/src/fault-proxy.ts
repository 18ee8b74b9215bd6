/**
 * A TCP proxy between one worker and Postgres that can break the network on demand: `drop()`
 * cuts every connection through it (both ends see a reset), `stall(ms)` stops carrying bytes in
 * both directions — and holds new connections — for `ms`, then delivers what was held, and
 * `switchTo(url)` sends new connections to another server and cuts the open ones (a failover
 * behind a virtual IP or a pooler).
 */
import { connect, createServer, type Socket } from 'node:net';

/** A running fault proxy. */
export interface FaultProxy {
  /** `databaseUrl` rewritten to go through the proxy. */
  readonly url: string;
  /** Open client connections. */
  connections(): number;
  drop(): void;
  stall(ms: number): void;
  /** From now on, connect to the server of `databaseUrl`; every open connection is cut. */
  switchTo(databaseUrl: string): void;
  close(): Promise<void>;
}

/** Starts a fault proxy on a free loopback port in front of the server of `databaseUrl`. */
export async function startFaultProxy(databaseUrl: string): Promise<FaultProxy> {
  let host = '';
  let port = 0;
  const target = (url: string) => {
    const parsed = new URL(url);
    host = parsed.hostname || '127.0.0.1';
    port = Number(parsed.port || 5432);
  };
  target(databaseUrl);
  const pairs = new Set<[Socket, Socket]>();
  let stalledUntil = 0;
  const whenFlowing = (fn: () => void) => {
    const wait = stalledUntil - Date.now();
    if (wait > 0) setTimeout(fn, wait);
    else fn();
  };
  const server = createServer((client) => {
    client.pause();
    whenFlowing(() => {
      const upstream = connect(port, host);
      const pair: [Socket, Socket] = [client, upstream];
      pairs.add(pair);
      // Bytes that arrive during a stall are held, in order, and delivered when it ends.
      const pipe = (from: Socket, to: Socket) => {
        const held: Buffer[] = [];
        const flush = () => {
          const wait = stalledUntil - Date.now();
          if (wait > 0) {
            setTimeout(flush, wait);
            return;
          }
          for (const chunk of held.splice(0)) to.write(chunk);
          from.resume();
        };
        from.on('data', (chunk: Buffer) => {
          if (held.length === 0 && Date.now() >= stalledUntil) {
            to.write(chunk);
            return;
          }
          held.push(chunk);
          if (held.length === 1) {
            from.pause();
            flush();
          }
        });
      };
      pipe(client, upstream);
      pipe(upstream, client);
      const end = () => {
        client.destroy();
        upstream.destroy();
        pairs.delete(pair);
      };
      for (const socket of pair) {
        socket.on('close', end);
        socket.on('error', end);
      }
      client.resume();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const address = server.address();
  if (!address || typeof address !== 'object') throw new Error('fault proxy has no address');
  const url = new URL(databaseUrl);
  url.hostname = '127.0.0.1';
  url.port = String(address.port);
  const drop = () => {
    for (const [client, upstream] of pairs) {
      client.resetAndDestroy();
      upstream.resetAndDestroy();
    }
    pairs.clear();
  };
  return {
    url: url.toString(),
    connections: () => pairs.size,
    drop,
    stall(ms) {
      stalledUntil = Math.max(stalledUntil, Date.now() + ms);
    },
    switchTo(url) {
      target(url);
      drop();
    },
    close: () =>
      new Promise<void>((resolve) => {
        drop();
        server.close(() => resolve());
      }),
  };
}
