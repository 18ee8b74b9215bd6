/**
 * The protocol's own way to cancel a running statement: a CancelRequest, sent on a new socket
 * to the same server, naming the backend by its pid and secret key (both from BackendKeyData at
 * connect). It needs no pooled connection, so it works on a pool of one or a single client.
 *
 * @packageDocumentation
 */
import { connect } from 'node:net';

/** Where and whom to cancel: the connection's server address and its BackendKeyData. */
export interface CancelTarget {
  /** Host name, IP, or a Unix socket directory (starting with `/`). */
  readonly host: string;
  readonly port: number;
  /** The backend pid from BackendKeyData. */
  readonly pid: number;
  /** The secret key from BackendKeyData. */
  readonly secretKey: number;
}

/** The CancelRequest code (1234 in the high half, 5678 in the low half). */
const CANCEL_REQUEST_CODE = 80877102;

/**
 * Sends one CancelRequest and resolves when the server has closed the socket (it does once it
 * has signalled the backend), or on any socket error: a cancel is best effort.
 */
export function sendCancelRequest(target: CancelTarget): Promise<void> {
  return new Promise<void>((resolve) => {
    const socket = target.host.startsWith('/')
      ? connect(`${target.host}/.s.PGSQL.${target.port}`)
      : connect(target.port, target.host);
    const done = () => {
      socket.destroy();
      resolve();
    };
    socket.once('connect', () => {
      const packet = Buffer.alloc(16);
      packet.writeInt32BE(16, 0);
      packet.writeInt32BE(CANCEL_REQUEST_CODE, 4);
      packet.writeInt32BE(target.pid, 8);
      packet.writeInt32BE(target.secretKey | 0, 12);
      socket.write(packet);
    });
    socket.once('close', done);
    socket.once('error', done);
    socket.setTimeout(10_000, done);
  });
}
