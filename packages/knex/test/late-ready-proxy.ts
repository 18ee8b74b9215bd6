/**
 * A TCP proxy in front of PostgreSQL that hands each server message to the client in a chunk of
 * its own, and holds back for `holdMs` the ReadyForQuery that follows an ErrorResponse:
 * node-postgres reports a failed query at its ErrorResponse, so it then reports it a second before
 * it learns the connection's new transaction status — what a loaded network does by chance.
 */
import { createServer, type Server, type Socket, connect as tcpConnect } from 'node:net';
import { setTimeout as delay } from 'node:timers/promises';

/** The proxy's address, and how to stop it. */
export interface LateReadyProxy {
  readonly url: string;
  close(): Promise<void>;
}

/** Starts the proxy in front of the server at `target` (a postgres:// URL). */
export async function startLateReadyProxy(target: string, holdMs = 1000): Promise<LateReadyProxy> {
  const upstream = new URL(target);
  const sockets = new Set<Socket>();
  const server: Server = createServer((client) => {
    const db = tcpConnect(Number(upstream.port || 5432), upstream.hostname);
    sockets.add(client).add(db);
    client.on('error', () => db.destroy());
    db.on('error', () => client.destroy());
    client.on('close', () => db.destroy());
    db.on('close', () => client.destroy());
    client.pipe(db);
    let pending = Buffer.alloc(0);
    let sending = Promise.resolve();
    let failed = false;
    db.on('data', (data: Buffer) => {
      pending = Buffer.concat([pending, data]);
      // Every server message: a type byte, then a length that counts itself.
      while (pending.length >= 5) {
        const size = 1 + pending.readUInt32BE(1);
        if (pending.length < size) break;
        const message = pending.subarray(0, size);
        pending = pending.subarray(size);
        const type = message[0];
        const hold = type === 0x5a && failed; // 'Z', ReadyForQuery, after an 'E', ErrorResponse
        failed = type === 0x45 || (failed && type !== 0x5a);
        sending = sending.then(async () => {
          if (hold) await delay(holdMs);
          if (!client.destroyed) client.write(message);
        });
      }
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const address = server.address();
  if (address === null || typeof address === 'string') throw new Error('proxy has no port');
  const url = new URL(target);
  url.hostname = '127.0.0.1';
  url.port = String(address.port);
  return {
    url: url.toString(),
    close: async () => {
      for (const socket of sockets) socket.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
