/**
 * A TCP proxy between a driver and Postgres that counts round trips on the wire, and can make the
 * wire slow.
 *
 * Every simple Query ('Q') and every extended-protocol Sync ('S') the client sends is answered by
 * one ReadyForQuery ('Z'). A round trip starts when the client sends such a message while none is
 * outstanding; messages it sends before the answers arrive (pipelining) ride in the same trip.
 * So `BEGIN; SELECT …` as one simple query is one trip, and so are BEGIN and a SELECT pipelined
 * without waiting; BEGIN, then after its answer a SELECT, are two.
 */
import { connect, createServer, type Server, type Socket } from 'node:net';

/** Options of {@link startRoundTripProxy}. */
export interface RoundTripProxyOptions {
  /**
   * Holds every chunk, in each direction, this many milliseconds before passing it on (order kept):
   * a slow network, for cases where one connection's latency must not cost another client anything.
   * Default 0.
   */
  readonly latencyMs?: number;
}

/** A running counting proxy. */
export interface RoundTripProxy {
  /** The database URL rewritten to go through the proxy. */
  readonly url: string;
  /** Round trips so far on all connections (connection start-up not included). */
  roundTrips(): number;
  /** Query ('Q') and Sync ('S') messages sent by clients so far: at least one per round trip. */
  clientSyncs(): number;
  /**
   * The transaction status of the last ReadyForQuery the server sent through the proxy: `'I'`
   * idle, `'T'` in a transaction block, `'E'` in a failed one.
   */
  lastTransactionStatus(): string | undefined;
  close(): Promise<void>;
}

/** Counts message types in one direction of a Postgres protocol stream. */
class MessageCounter {
  private buffer: Buffer = Buffer.alloc(0);
  private started: boolean;

  constructor(
    private readonly onMessage: (type: number, firstByte: number | undefined) => void,
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
      this.onMessage(this.buffer[0] as number, length > 4 ? this.buffer[5] : undefined);
      this.buffer = this.buffer.subarray(1 + length);
    }
  }
}

/** Starts a proxy on a free loopback port in front of the server of `databaseUrl`. */
export async function startRoundTripProxy(
  databaseUrl: string,
  options: RoundTripProxyOptions = {},
): Promise<RoundTripProxy> {
  const latencyMs = options.latencyMs ?? 0;
  if (!Number.isInteger(latencyMs) || latencyMs < 0)
    throw new Error(`latencyMs must be a non-negative integer, got ${String(latencyMs)}`);
  // Equal delays fire in the order they were set, so a delayed stream keeps its byte order.
  const pass = (to: Socket, chunk: Buffer) => {
    if (latencyMs === 0) to.write(chunk);
    else setTimeout(() => to.destroyed || to.write(chunk), latencyMs);
  };
  const target = new URL(databaseUrl);
  const host = target.hostname || '127.0.0.1';
  const port = Number(target.port || 5432);
  let trips = 0;
  let syncs = 0;
  let status: string | undefined;
  const sockets = new Set<Socket>();
  const server: Server = createServer((client) => {
    const upstream = connect(port, host);
    sockets.add(client);
    sockets.add(upstream);
    // Answers this connection's client is still waiting for.
    let outstanding = 0;
    const fromServer = new MessageCounter((type, firstByte) => {
      if (type !== 0x5a /* Z */) return;
      // The start-up ReadyForQuery answers nothing the client sent: clamp at zero.
      outstanding = Math.max(0, outstanding - 1);
      if (firstByte !== undefined) status = String.fromCharCode(firstByte);
    }, false);
    const fromClient = new MessageCounter((type) => {
      if (type === 0x51 /* Q */ || type === 0x53 /* S */) {
        syncs++;
        if (outstanding === 0) trips++;
        outstanding++;
      }
    }, true);
    client.on('data', (chunk: Buffer) => {
      fromClient.push(chunk);
      pass(upstream, chunk);
    });
    upstream.on('data', (chunk: Buffer) => {
      fromServer.push(chunk);
      pass(client, chunk);
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
    roundTrips: () => trips,
    clientSyncs: () => syncs,
    lastTransactionStatus: () => status,
    close: () =>
      new Promise<void>((resolve) => {
        for (const socket of sockets) socket.destroy();
        server.close(() => resolve());
      }),
  };
}
