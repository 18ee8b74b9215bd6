/**
 * A TCP proxy in front of PostgreSQL that can hold back what the server sends, its hang-up
 * included: a backend terminated while held has exited on the server, but its FATAL and the
 * socket's close have not reached the client — the moment a loaded machine gives a pool by chance,
 * when it lends a connection whose backend is already gone. Held bytes and the close are passed on
 * by `release()`, in order.
 */
import { createServer, type Server, type Socket, connect as tcpConnect } from 'node:net';

/** The proxy's address, its hold, and how to stop it. */
export interface HeldGoodbyeProxy {
  readonly url: string;
  /**
   * Holds, from now on, everything the server sends on every connection and its closing of them.
   * `clientSpoke` resolves when a client sends anything while held.
   */
  hold(): { readonly clientSpoke: Promise<void> };
  /** Passes on what was held, then the closes, and stops holding. */
  release(): void;
  /**
   * Terminates the backends of every connection through the proxy, from another connection
   * (`query`, e.g. a `pg.Client`'s), and resolves once they have exited (`pg_terminate_backend`
   * with a timeout waits for that).
   */
  terminateBackends(query: (text: string, params: unknown[]) => Promise<unknown>): Promise<void>;
  close(): Promise<void>;
}

/** Starts the proxy in front of the server at `target` (a postgres:// URL). */
export async function startHeldGoodbyeProxy(target: string): Promise<HeldGoodbyeProxy> {
  const upstream = new URL(target);
  const sockets = new Set<Socket>();
  // The local ports of the proxy's own connections to the server: `client_port` there.
  const upstreamPorts = new Set<number>();
  // While held: what each connection's server sent, and whether it hung up.
  let held: { spoke: () => void; flushers: (() => void)[] } | undefined;
  const server: Server = createServer((client) => {
    const db = tcpConnect(Number(upstream.port || 5432), upstream.hostname);
    sockets.add(client).add(db);
    db.on('connect', () => {
      const port = db.localPort;
      if (port === undefined) return;
      upstreamPorts.add(port);
      db.on('close', () => upstreamPorts.delete(port));
    });
    client.on('error', () => db.destroy());
    db.on('error', () => {});
    client.on('close', () => db.destroy());
    // Writes to a server that hung up are lost, as on a real network.
    client.on('data', (data: Buffer) => {
      held?.spoke();
      if (!db.destroyed && db.writable) db.write(data);
    });
    const queue: (Buffer | 'end')[] = [];
    let queued = false;
    const pass = (item: Buffer | 'end') => {
      if (item === 'end') client.end();
      else if (!client.destroyed) client.write(item);
    };
    const send = (item: Buffer | 'end') => {
      if (held === undefined) return pass(item);
      queue.push(item);
      if (queued) return;
      queued = true;
      held.flushers.push(() => {
        queued = false;
        for (const next of queue.splice(0)) pass(next);
      });
    };
    db.on('data', (data: Buffer) => send(data));
    db.on('close', () => send('end'));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const address = server.address();
  if (address === null || typeof address === 'string') throw new Error('proxy has no port');
  const url = new URL(target);
  url.hostname = '127.0.0.1';
  url.port = String(address.port);
  return {
    url: url.toString(),
    hold: () => {
      let spoke = () => {};
      const clientSpoke = new Promise<void>((resolve) => {
        spoke = resolve;
      });
      held = { spoke, flushers: [] };
      return { clientSpoke };
    },
    release: () => {
      const flushers = held?.flushers ?? [];
      held = undefined;
      for (const flush of flushers) flush();
    },
    terminateBackends: async (query) => {
      await query(
        'SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE client_port = ANY($1::int[])',
        [[...upstreamPorts]],
      );
    },
    close: async () => {
      for (const socket of sockets) socket.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
