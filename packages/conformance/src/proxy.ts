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
  /**
   * Arms a one-shot trap: the next `COMMIT` a client sends (a simple query, a Parse, or the Bind of
   * a statement the connection prepared as COMMIT) is passed to the server, but the
   * server's answer is withheld and, once the server has answered (so the commit is done), the
   * link is cut both ways. Resolves when the link has been cut: the client sent COMMIT and never
   * heard back — the outcome it must report as unknown.
   */
  holdCommitReply(): Promise<void>;
  /**
   * Holds every cancel sent from now on — a statement calling `pg_cancel_backend`, or a protocol
   * CancelRequest on a socket of its own — before it reaches the server, until `release()`.
   * `started` resolves when the first one is held.
   */
  holdCancels(): { readonly started: Promise<void>; release(): void };
  /**
   * Records every statement clients send from now on, in the order they reach the proxy (all
   * connections); `stop()` returns them. Restarts the statement count that traps use.
   */
  record(): { stop(): WireStatement[] };
  /**
   * Arms a one-shot trap on the statement at `index` (counted from 0, from now on, over all
   * connections, as {@link RoundTripProxy.record} numbers them), or on the first statement from now
   * on that `which` accepts (its text, say, where a case traps one statement of a protocol whose
   * other statements vary by adapter): see {@link WireFault}.
   */
  trapStatement(
    which: number | ((statement: WireStatement) => boolean),
    fault: WireFault,
  ): StatementTrap;
  /**
   * Holds, from now on, everything the server sends on every connection open now, its hang-up
   * included: a backend terminated while held has exited on the server, but its FATAL and the
   * socket's close have not reached the client — the moment a loaded machine gives a pool by
   * chance, when it lends an idle connection whose backend is already gone. Connections opened
   * later pass freely. See {@link GoodbyeHold}.
   */
  holdGoodbyes(): GoodbyeHold;
  close(): Promise<void>;
}

/** A hold set by {@link RoundTripProxy.holdGoodbyes}. */
export interface GoodbyeHold {
  /** The held connections, numbered as {@link WireStatement.connection} numbers them. */
  readonly connections: readonly number[];
  /**
   * The local ports of the proxy's links to the server for the held connections: the
   * `client_port` of their backends in `pg_stat_activity` (when the server is PostgreSQL itself),
   * for terminating them from another connection.
   */
  readonly serverPorts: readonly number[];
  /** Resolves when a client sends anything, on any connection, after the hold began. */
  readonly clientSpoke: Promise<void>;
  /**
   * Ends the proxy's links to the server for the held connections, as the server side would hang
   * up (a pooler restarting or closing an idle client, a failover): the server sees its client
   * go; the client hears of it only at {@link GoodbyeHold.release}.
   */
  hangUp(): void;
  /** Passes on what was held, then the hang-ups, in order, and stops holding. */
  release(): void;
}

/**
 * What a {@link StatementTrap} does to its statement:
 * - `'drop-before'`: cuts the link both ways before any of the statement reaches the server;
 * - `'drop-after'`: passes the statement on, withholds the server's whole answer, and cuts the link
 *   once the server has answered (it ran the statement; the client never hears how);
 * - `'hold-statement'`: holds the statement (and whatever the client sends after it) before the
 *   server, until `release()`;
 * - `'hold-reply'`: passes the statement on and holds the server's answer (and what follows it)
 *   until `release()`; `fired` resolves once the server has answered in full.
 */
export type WireFault = 'drop-before' | 'drop-after' | 'hold-statement' | 'hold-reply';

/**
 * One statement as a client sent it through the proxy: a simple Query, or the extended-protocol
 * messages up to and including their Sync.
 */
export interface WireStatement {
  /** Its position among the statements sent since `record()` or `trapStatement()`, from 0. */
  readonly index: number;
  /** Which proxied connection sent it: 1 for the first the proxy accepted, and so on. */
  readonly connection: number;
  /** Its SQL (the Query's, or its Parse's, or the named prepared statement its Bind runs). */
  readonly text: string;
}

/** A trap set on one statement by {@link RoundTripProxy.trapStatement}. */
export interface StatementTrap {
  /** Resolves with the statement once the trap has acted: cut the link, or holds. */
  readonly fired: Promise<WireStatement>;
  /** Passes on what the trap holds (nothing for the drops) and stops holding. */
  release(): void;
}

/** Client message types that belong to the statement a later Sync ends: Parse, Bind, Describe, Execute, Close. */
const STATEMENT_PARTS = new Set([0x50, 0x42, 0x44, 0x45, 0x43]);

/** The code of a protocol CancelRequest, sent instead of a startup message on a new socket. */
const CANCEL_REQUEST_CODE = 80877102;

/** Whether a client message is a COMMIT: a simple Query, or the Parse of an extended one. */
function isCommit(type: number, body: Buffer): boolean {
  let text: string;
  if (type === 0x51 /* Q */) text = body.toString('utf8');
  else if (type === 0x50 /* P */) {
    const nameEnd = body.indexOf(0);
    text = body.subarray(nameEnd + 1).toString('utf8');
  } else return false;
  return /^\s*commit\b/i.test(text);
}

/** Counts message types in one direction of a Postgres protocol stream. */
class MessageCounter {
  private buffer: Buffer = Buffer.alloc(0);
  private started: boolean;

  constructor(
    private readonly onMessage: (
      type: number,
      firstByte: number | undefined,
      body: Buffer,
      raw: Buffer,
    ) => void,
    // The client's first message (startup) has no type byte.
    hasUntypedStartup: boolean,
    private readonly onStartup: (packet: Buffer) => void = () => {},
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
        this.onStartup(this.buffer.subarray(0, length));
        this.buffer = this.buffer.subarray(length);
        this.started = true;
        continue;
      }
      if (this.buffer.length < 5) return;
      const length = this.buffer.readInt32BE(1);
      if (this.buffer.length < 1 + length) return;
      this.onMessage(
        this.buffer[0] as number,
        length > 4 ? this.buffer[5] : undefined,
        this.buffer.subarray(5, 1 + length),
        this.buffer.subarray(0, 1 + length),
      );
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
  let commitTrap: (() => void) | undefined;
  let cancelHold: { held: Buffer[][]; flushers: (() => void)[]; onFirst: () => void } | undefined;
  // Per connection: passes on what a statement trap holds there.
  const releasers = new Map<number, () => void>();
  // Statements seen since the last `record()` or `trapStatement()`, and what to do with them.
  let statementCount = 0;
  let recording: WireStatement[] | undefined;
  let trap:
    | {
        matches: (s: WireStatement) => boolean;
        fault: WireFault;
        fire: (s: WireStatement) => void;
      }
    | undefined;
  let connectionCount = 0;
  // Per open connection: its link to the server, and how to hold its server side.
  const links = new Map<number, { upstream: Socket; hold: () => { flush: () => void } }>();
  let goodbyeHold: { spoke: () => void } | undefined;
  const server: Server = createServer((client) => {
    const upstream = connect(port, host);
    const connection = ++connectionCount;
    sockets.add(client);
    sockets.add(upstream);
    const cut = () => {
      client.destroy();
      upstream.destroy();
    };
    // Answers this connection's client is still waiting for.
    let outstanding = 0;
    // Set when this connection's COMMIT reply is to be withheld: called on the server's answer.
    let doomed: (() => void) | undefined;
    // Client bytes held back (a cancel), in order, until the hold is released.
    let holding: Buffer[] | undefined;
    // Names of the statements this connection prepared as COMMIT.
    const preparedCommits = new Set<string>();
    // The statement being assembled (extended-protocol messages up to their Sync), its SQL text,
    // and the texts of the statements this connection prepared by name.
    let unit: Buffer[] = [];
    let unitText = '';
    const preparedTexts = new Map<string, string>();
    // Statements passed to the server on this connection, and ReadyForQuery answers seen (the
    // first one answers the start-up, not a statement).
    let forwarded = 0;
    let answered = -1;
    // A trapped statement held before the server (with what the client sends after it).
    let heldStatement: Buffer[] | undefined;
    // A trapped statement's answer, from the first byte of it: dropped (then the link cut) or held.
    let answerTrap:
      | { unit: number; drop: boolean; held: Buffer[]; statement: WireStatement; fire: () => void }
      | undefined;
    // Bytes to pass on once the chunk being read has been parsed.
    const toServer: Buffer[] = [];
    const toClient: Buffer[] = [];

    const statementDone = (bytes: Buffer[], text: string) => {
      const statement: WireStatement = { index: statementCount++, connection, text };
      recording?.push(statement);
      const armed = trap?.matches(statement) ? trap : undefined;
      if (armed) trap = undefined;
      if (armed?.fault === 'drop-before') {
        cut();
        armed.fire(statement);
        return;
      }
      if (armed?.fault === 'hold-statement') {
        heldStatement = [...bytes];
        armed.fire(statement);
        return;
      }
      if (heldStatement) {
        heldStatement.push(...bytes);
        return;
      }
      forwarded++;
      toServer.push(...bytes);
      if (armed) {
        answerTrap = {
          unit: forwarded,
          drop: armed.fault === 'drop-after',
          held: [],
          statement,
          fire: () => armed.fire(statement),
        };
      }
    };
    // While this connection's goodbye is held: what its server sent, then whether it hung up.
    let goodbye: (Buffer | 'hang-up')[] | undefined;
    links.set(connection, {
      upstream,
      hold: () => {
        goodbye ??= [];
        return {
          flush: () => {
            const held = goodbye ?? [];
            goodbye = undefined;
            for (const item of held) {
              // Ended, not destroyed: what was held before the hang-up reaches the client first.
              if (item === 'hang-up') client.end();
              else if (!client.destroyed) pass(client, item);
            }
          },
        };
      },
    });
    releasers.set(connection, () => {
      if (heldStatement) {
        const bytes = heldStatement;
        heldStatement = undefined;
        forwarded++;
        if (!upstream.destroyed) pass(upstream, Buffer.concat(bytes));
      }
      if (answerTrap && !answerTrap.drop) {
        const bytes = answerTrap.held;
        answerTrap = undefined;
        if (!client.destroyed) pass(client, Buffer.concat(bytes));
      }
    });

    const fromServer = new MessageCounter((type, firstByte, _body, raw) => {
      // Which statement of this connection this message answers (0: the start-up).
      const answering = answered + 1;
      if (type === 0x5a /* Z */) {
        answered++;
        // The start-up ReadyForQuery answers nothing the client sent: clamp at zero.
        outstanding = Math.max(0, outstanding - 1);
        if (firstByte !== undefined) status = String.fromCharCode(firstByte);
      }
      if (answerTrap && answering >= answerTrap.unit) {
        const trapped = answerTrap;
        if (trapped.drop) {
          if (type === 0x5a && answering === trapped.unit) {
            answerTrap = undefined;
            cut();
            trapped.fire();
          }
          return;
        }
        trapped.held.push(raw);
        if (type === 0x5a && answering === trapped.unit) trapped.fire();
        return;
      }
      if (doomed) {
        if (type !== 0x5a) return;
        const done = doomed;
        doomed = undefined;
        cut();
        done();
        return;
      }
      toClient.push(raw);
    }, false);
    const holdThisConnection = () => {
      if (!cancelHold || holding) return;
      holding = [];
      cancelHold.held.push(holding);
      const held = holding;
      cancelHold.flushers.push(() => {
        for (const chunk of held) pass(upstream, chunk);
        holding = undefined;
      });
      cancelHold.onFirst();
    };
    const fromClient = new MessageCounter(
      (type, _firstByte, body, raw) => {
        if (type === 0x51 /* Q */ || type === 0x53 /* S */) {
          syncs++;
          if (outstanding === 0) trips++;
          outstanding++;
        }
        // A named statement prepared once (postgres.js's `prepare: true`) is later run by a
        // Bind alone: remember which names are COMMITs.
        let commit = isCommit(type, body);
        if (type === 0x50 /* P */ && commit) {
          const name = body.subarray(0, body.indexOf(0)).toString('utf8');
          if (name !== '') preparedCommits.add(name);
        } else if (type === 0x42 /* B */) {
          const portalEnd = body.indexOf(0);
          const name = body
            .subarray(portalEnd + 1, body.indexOf(0, portalEnd + 1))
            .toString('utf8');
          commit = name !== '' && preparedCommits.has(name);
          if (unitText === '') unitText = preparedTexts.get(name) ?? '';
        }
        if (commitTrap && commit) {
          doomed = commitTrap;
          commitTrap = undefined;
        }
        if (cancelHold && body.includes('pg_cancel_backend')) holdThisConnection();
        // Statements travel whole: a trap must be able to stop one before any of it runs.
        if (type === 0x50 /* P */) {
          const nameEnd = body.indexOf(0);
          unitText = body.subarray(nameEnd + 1, body.indexOf(0, nameEnd + 1)).toString('utf8');
          const name = body.subarray(0, nameEnd).toString('utf8');
          if (name !== '') preparedTexts.set(name, unitText);
        }
        if (type === 0x51 /* Q */) unitText = body.subarray(0, body.length - 1).toString('utf8');
        if (STATEMENT_PARTS.has(type)) {
          unit.push(raw);
          return;
        }
        if (type === 0x51 /* Q */ || type === 0x53 /* S */) {
          const bytes = [...unit, raw];
          const text = unitText;
          unit = [];
          unitText = '';
          statementDone(bytes, text);
          return;
        }
        // Anything else (a Flush, Terminate, authentication) goes at once, with what came before.
        const bytes = [...unit, raw];
        unit = [];
        if (heldStatement) heldStatement.push(...bytes);
        else toServer.push(...bytes);
      },
      true,
      (packet) => {
        if (packet.length === 16 && packet.readInt32BE(4) === CANCEL_REQUEST_CODE) {
          holdThisConnection();
        }
        toServer.push(packet);
      },
    );
    client.on('data', (chunk: Buffer) => {
      goodbyeHold?.spoke();
      fromClient.push(chunk);
      if (toServer.length === 0) return;
      const bytes = Buffer.concat(toServer);
      toServer.length = 0;
      if (holding) holding.push(bytes);
      // Writes to a server that hung up are lost, as on a real network.
      else if (!upstream.destroyed) pass(upstream, bytes);
    });
    upstream.on('data', (chunk: Buffer) => {
      fromServer.push(chunk);
      if (toClient.length === 0 || client.destroyed) {
        toClient.length = 0;
        return;
      }
      const bytes = Buffer.concat(toClient);
      toClient.length = 0;
      if (goodbye) goodbye.push(bytes);
      else pass(client, bytes);
    });
    const end = () => {
      cut();
      sockets.delete(client);
      sockets.delete(upstream);
      releasers.delete(connection);
      links.delete(connection);
    };
    const serverGone = () => {
      if (goodbye === undefined) end();
      else if (!goodbye.includes('hang-up')) goodbye.push('hang-up');
    };
    client.on('close', end);
    upstream.on('close', serverGone);
    client.on('error', end);
    upstream.on('error', serverGone);
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
    holdCommitReply: () =>
      new Promise<void>((resolve) => {
        commitTrap = resolve;
      }),
    record: () => {
      const statements: WireStatement[] = [];
      statementCount = 0;
      recording = statements;
      return {
        stop: () => {
          if (recording === statements) recording = undefined;
          return statements;
        },
      };
    },
    trapStatement: (which, fault) => {
      if (typeof which === 'number' && (!Number.isInteger(which) || which < 0))
        throw new Error(`index must be a non-negative integer, got ${String(which)}`);
      const matches = typeof which === 'number' ? (s: WireStatement) => s.index === which : which;
      statementCount = 0;
      let fire!: (statement: WireStatement) => void;
      let at: number | undefined;
      const fired = new Promise<WireStatement>((resolve) => {
        fire = (statement) => {
          at = statement.connection;
          resolve(statement);
        };
      });
      trap = { matches, fault, fire };
      return {
        fired,
        release: () => {
          if (trap?.fire === fire) trap = undefined;
          if (at !== undefined) releasers.get(at)?.();
        },
      };
    },
    holdCancels: () => {
      let onFirst!: () => void;
      const started = new Promise<void>((resolve) => {
        onFirst = resolve;
      });
      const hold = { held: [] as Buffer[][], flushers: [] as (() => void)[], onFirst };
      cancelHold = hold;
      return {
        started,
        release: () => {
          if (cancelHold === hold) cancelHold = undefined;
          for (const flush of hold.flushers) flush();
        },
      };
    },
    holdGoodbyes: () => {
      let spoke = () => {};
      const clientSpoke = new Promise<void>((resolve) => {
        spoke = resolve;
      });
      const hold = { spoke };
      goodbyeHold = hold;
      const held = [...links].map(([connection, link]) => ({
        connection,
        link,
        ...link.hold(),
      }));
      return {
        connections: held.map((h) => h.connection),
        serverPorts: held.flatMap((h) =>
          h.link.upstream.localPort === undefined ? [] : [h.link.upstream.localPort],
        ),
        clientSpoke,
        hangUp: () => {
          for (const h of held) h.link.upstream.destroy();
        },
        release: () => {
          if (goodbyeHold === hold) goodbyeHold = undefined;
          for (const h of held) h.flush();
        },
      };
    },
    close: () =>
      new Promise<void>((resolve) => {
        for (const socket of sockets) socket.destroy();
        server.close(() => resolve());
      }),
  };
}
