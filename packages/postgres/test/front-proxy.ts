/**
 * A TCP proxy in front of another (the conformance round-trip proxy, say) whose client links can
 * be reset (RST) from the test: what a dropped network does to a driver, which a clean close does
 * not show (Node reports a reset socket's error at once and its close only later).
 */
import { type AddressInfo, connect, createServer, type Socket } from 'node:net';

/** A running front proxy. */
export interface FrontProxy {
  /** `targetUrl` rewritten to go through this proxy. */
  readonly url: string;
  /** Resets every client link open now. */
  resetAll(): void;
  close(): Promise<void>;
}

/**
 * Starts a front proxy for the server of `targetUrl`; with `resetFirst`, the first link is reset
 * as it is accepted (a connect that fails).
 */
export async function startFrontProxy(
  targetUrl: string,
  options: { readonly resetFirst?: boolean } = {},
): Promise<FrontProxy> {
  const target = new URL(targetUrl);
  const clients = new Set<Socket>();
  let accepted = 0;
  const server = createServer((socket) => {
    accepted++;
    if (options.resetFirst === true && accepted === 1) {
      socket.resetAndDestroy();
      return;
    }
    clients.add(socket);
    const upstream = connect(Number(target.port), target.hostname);
    socket.pipe(upstream).pipe(socket);
    socket.on('error', () => upstream.destroy());
    upstream.on('error', () => socket.destroy());
    socket.on('close', () => {
      clients.delete(socket);
      upstream.destroy();
    });
    upstream.on('close', () => socket.destroy());
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const url = new URL(targetUrl);
  url.hostname = '127.0.0.1';
  url.port = String((server.address() as AddressInfo).port);
  return {
    url: url.toString(),
    resetAll: () => {
      for (const socket of clients) socket.resetAndDestroy();
      clients.clear();
    },
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}
