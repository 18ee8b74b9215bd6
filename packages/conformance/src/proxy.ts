/**
 * A TCP proxy between a driver and Postgres that counts round trips: every ReadyForQuery ('Z')
 * message the server sends ends one exchange the client had to wait for, whatever the protocol
 * (one simple query with several statements, or Parse/Bind/Execute/Sync).
 */
import { connect, createServer, type Server, type Socket } from 'node:net';

/** A running counting proxy. */
export interface RoundTripProxy {
  /** The database URL rewritten to go through the proxy. */
  readonly url: string;
  /** ReadyForQuery messages seen so far on all connections, startup included. */
  roundTrips(): number;
  /** Simple-protocol Query ('Q') and extended Sync ('S') messages sent by clients so far. */
  clientSyncs(): number;
  close(): Promise<void>;
}

/** Counts message types in one direction of a Postgres protocol stream. */
class MessageCounter {
  private buffer: Buffer = Buffer.alloc(0);
  private started: boolean;

  constructor(
    private readonly onMessage: (type: number) => void,
    // The client's first message (startup) has no type byte.
    hasUntypedStartup: boolean,
  ) {
    this.started = !hasUntypedStartup;
  }

  push(chunk: Buffer): void {
    this.buffer = this.buffer.length === 0 ? chunk : Buffer.concat([this.buffer, chunk]);
    for (;;) {
      if (!this.started) {
        if (this.buffer.length < 4) return;
        const length = this.buffer.readInt32BE(0);
        if (this.buffer.length < length) return;
        this.buffer = this.buffer.subarray(length);
        this.started = true;
        continue;
      }
      if (this.buffer.length < 5) return;
      const length = this.buffer.readInt32BE(1);
      if (this.buffer.length < 1 + length) return;
      this.onMessage(this.buffer[0] as number);
      this.buffer = this.buffer.subarray(1 + length);
    }
  }
}

/** Starts a proxy on a free loopback port in front of the server of `databaseUrl`. */
export async function startRoundTripProxy(databaseUrl: string): Promise<RoundTripProxy> {
  const target = new URL(databaseUrl);
  const host = target.hostname || '127.0.0.1';
  const port = Number(target.port || 5432);
  let readyForQuery = 0;
  let syncs = 0;
  const sockets = new Set<Socket>();
  const server: Server = createServer((client) => {
    const upstream = connect(port, host);
    sockets.add(client);
    sockets.add(upstream);
    const fromServer = new MessageCounter((type) => {
      if (type === 0x5a /* Z */) readyForQuery++;
    }, false);
    const fromClient = new MessageCounter((type) => {
      if (type === 0x51 /* Q */ || type === 0x53 /* S */) syncs++;
    }, true);
    client.on('data', (chunk: Buffer) => {
      fromClient.push(chunk);
      upstream.write(chunk);
    });
    upstream.on('data', (chunk: Buffer) => {
      fromServer.push(chunk);
      client.write(chunk);
    });
    const end = () => {
      client.destroy();
      upstream.destroy();
      sockets.delete(client);
      sockets.delete(upstream);
    };
    client.on('close', end);
    upstream.on('close', end);
    client.on('error', end);
    upstream.on('error', end);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const address = server.address();
  if (!address || typeof address !== 'object') throw new Error('proxy has no address');
  const url = new URL(databaseUrl);
  url.hostname = '127.0.0.1';
  url.port = String(address.port);
  return {
    url: url.toString(),
    roundTrips: () => readyForQuery,
    clientSyncs: () => syncs,
    close: () =>
      new Promise<void>((resolve) => {
        for (const socket of sockets) socket.destroy();
        server.close(() => resolve());
      }),
  };
}
