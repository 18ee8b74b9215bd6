/**
 * The Prisma executor: every lock in an interactive transaction (`$transaction(async (tx) => …)`),
 * lockkit's statements through `tx.$queryRawUnsafe` with positional parameters. Prisma can pin no
 * connection, so there is no session capability.
 */
import {
  type LockExecutor,
  LockkitError,
  type Row,
  type TransactionContext,
  TransactionExpiredError,
} from '@lockkit/core';
import {
  BACKEND_PID,
  BackendWatch,
  ConnectionFate,
  FateTransactionContext,
  isConnectionLoss,
  retryDeadStart,
} from '@lockkit/core/adapter';

/** Prisma's interactive-transaction limits. */
export interface PrismaTransactionOptions {
  /** Longest the transaction may run, in ms (Prisma's default 5000). On expiry Prisma rolls it back. */
  readonly timeout?: number;
  /** Longest to wait for a connection to start it, in ms (Prisma's default 2000). */
  readonly maxWait?: number;
}

/** What lockkit needs of Prisma's transaction client (`tx`). */
export interface PrismaTransactionClientLike {
  $queryRawUnsafe<T = unknown>(query: string, ...values: unknown[]): Promise<T>;
}

/** What lockkit needs of a `PrismaClient` — declared here, so no generated type is imported. */
export interface PrismaClientLike<Tx extends PrismaTransactionClientLike> {
  $transaction<R>(fn: (tx: Tx) => Promise<R>, options?: PrismaTransactionOptions): Promise<R>;
  $queryRawUnsafe<T = unknown>(query: string, ...values: unknown[]): Promise<T>;
}

/** Options of {@link prismaExecutor}. */
export interface PrismaExecutorOptions extends PrismaTransactionOptions {
  /** Name reported in errors; default `'prisma'`. */
  readonly name?: string;
  /** Declare a transaction-pooling proxy (informational: Prisma has no session scope anyway). */
  readonly transactionPooler?: boolean;
  /**
   * How often, while tasks run, lockkit asks the server whether their connections still live (Prisma
   * reports no connection events). Default 1000 ms.
   */
  readonly livenessCheckMs?: number;
}

/** The statement a watched connection is probed with: it fails at once on a dead connection. */
const PROBE = 'SELECT 1';

function codeOf(error: unknown): string | undefined {
  const e = error as {
    code?: unknown;
    cause?: { code?: unknown };
    meta?: { code?: unknown };
  } | null;
  for (const candidate of [e?.code, e?.meta?.code, e?.cause?.code]) {
    if (typeof candidate === 'string') return candidate;
  }
  return undefined;
}

/** Prisma's "this transaction is over" failures: P2028, and its messages for an expired or closed one. */
function expiry(
  error: unknown,
  options: Required<PrismaTransactionOptions>,
): TransactionExpiredError | undefined {
  const message = error instanceof Error ? error.message : String(error);
  const isP2028 = codeOf(error) === 'P2028';
  if (!isP2028 && !/Transaction (already closed|not found|API error)|expired/i.test(message))
    return undefined;
  if (/Unable to start a transaction|maxWait/i.test(message)) {
    return new TransactionExpiredError(
      `Prisma could not start the lock's transaction within maxWait (${options.maxWait} ms): no connection was free. Raise the maxWait option (or the pool size).`,
      'maxWait',
      { cause: error },
    );
  }
  return new TransactionExpiredError(
    `Prisma closed the lock's interactive transaction after its timeout (${options.timeout} ms); it was rolled back and the lock released. Raise the timeout option, or use a lease for long jobs.`,
    'timeout',
    { cause: error },
  );
}

/**
 * Refuses, before any SQL, Prisma's transaction client (the `tx` of `$transaction`) in place of the
 * PrismaClient. Prisma 7 gives that client a `$transaction` of its own, which nests in the
 * caller's transaction: lockkit's transaction-scoped lock would then outlive the call until the
 * caller's transaction ends (older Prisma gives it none, and every call fails with a TypeError).
 * A transaction client is known by what Prisma takes away from it: `$connect`, `$disconnect`.
 */
function refuseTransactionClient(prisma: unknown, name: string): void {
  const p = (typeof prisma === 'object' && prisma !== null ? prisma : {}) as Record<
    string,
    unknown
  >;
  const runsSql = typeof p.$queryRawUnsafe === 'function';
  const client = typeof p.$connect === 'function' || typeof p.$disconnect === 'function';
  if (typeof p.$transaction === 'function' && (client || !runsSql)) return;
  const given = runsSql ? 'a transaction client (the tx of $transaction)' : String(prisma);
  throw new LockkitError(
    'OPTION_INVALID',
    `The ${name} executor needs the PrismaClient, but was given ${given}: pass the PrismaClient itself (extended with $extends or not); lockkit opens its own interactive transactions.`,
  );
}

/**
 * A {@link LockExecutor} over a `PrismaClient` (Prisma ≥ 6.16, e.g. the Rust-free client with
 * `@prisma/adapter-pg`). Capability: transaction scope only. Tasks receive Prisma's `tx`, so their
 * writes join the lock's transaction.
 *
 * @example
 * ```ts
 * import { PrismaPg } from '@prisma/adapter-pg';
 * import { PrismaClient } from './generated/prisma/client';
 * import { createLockClient } from '@lockkit/core';
 * import { prismaExecutor } from '@lockkit/prisma';
 * const prisma = new PrismaClient({ adapter: new PrismaPg({ connectionString: process.env.DATABASE_URL }) });
 * const locks = createLockClient(prismaExecutor(prisma, { timeout: 15_000 }));
 * ```
 */
export function prismaExecutor<Tx extends PrismaTransactionClientLike>(
  prisma: PrismaClientLike<Tx>,
  options: PrismaExecutorOptions = {},
): LockExecutor<Tx, never> {
  refuseTransactionClient(prisma, options.name ?? 'prisma');
  const limits = { timeout: options.timeout ?? 5000, maxWait: options.maxWait ?? 2000 };
  const watch = new BackendWatch((text, params) => prisma.$queryRawUnsafe(text, ...params), {
    intervalMs: options.livenessCheckMs ?? 1000,
  });
  async function begin<T>(fn: (ctx: TransactionContext<Tx>) => Promise<T>): Promise<T> {
    const fate = new ConnectionFate();
    let running: Promise<unknown> | undefined;
    let unwatch: (() => void) | undefined;
    let expiryTimer: NodeJS.Timeout | undefined;
    try {
      return await prisma.$transaction(async (tx) => {
        // Prisma rolls the transaction back when its timeout passes, whatever the callback does:
        // the lock is gone then, so the task must hear of it. Counted from here, after Prisma's
        // own clock started, so it never fires before Prisma has really expired it.
        expiryTimer = setTimeout(
          () =>
            fate.abort(
              expiry(Object.assign(new Error('Transaction expired'), { code: 'P2028' }), limits),
            ),
          limits.timeout,
        );
        expiryTimer.unref();
        const send = async (text: string, params?: readonly unknown[]): Promise<Row[]> => {
          if (fate.aborted) throw fate.reason;
          try {
            return await tx.$queryRawUnsafe<Row[]>(text, ...(params ?? []));
          } catch (error) {
            const expired = expiry(error, limits);
            if (expired) fate.abort(expired);
            else if (isConnectionLoss(error)) fate.abort(error);
            throw expired ?? error;
          }
        };
        // While every connection of the pool is busy, the watch's question through the pool waits:
        // it probes the transaction's own connection instead, where a statement fails at once if
        // the connection died. Only while the task runs: Prisma commits once it returns. Sent as
        // is, not through `send`: the watch alone decides what a failed probe means.
        let taskRunning = true;
        const probe = () => (taskRunning ? tx.$queryRawUnsafe(PROBE) : Promise.resolve());
        // The backend to watch: core's opening statements report it (they start with
        // BACKEND_PID), which saves a round trip; after any other first statement, ask.
        let watching = false;
        const query = async (text: string, params?: readonly unknown[]): Promise<Row[]> => {
          const rows = await send(text, params);
          if (!watching) {
            watching = true;
            const reported = text.startsWith(BACKEND_PID) ? rows : await send(BACKEND_PID);
            unwatch = watch.add({ pid: Number(reported[0]?.pid), fate, probe });
          }
          return rows;
        };
        const task = fn(new FateTransactionContext(query, tx, fate));
        running = task;
        try {
          return await task;
        } finally {
          taskRunning = false;
        }
      }, limits);
    } catch (error) {
      const expired = expiry(error, limits);
      if (expired && !fate.aborted) fate.abort(expired);
      if (running) await running.catch(() => {});
      throw fate.aborted && fate.reason instanceof TransactionExpiredError
        ? fate.reason
        : (expired ?? error);
    } finally {
      clearTimeout(expiryTimer);
      unwatch?.();
    }
  }
  const executor: LockExecutor<Tx, never> = {
    name: options.name ?? 'prisma',
    transactionPooler: options.transactionPooler === true,
    // A connection whose backend was terminated a moment ago is lent as live until adapter-pg's
    // client reads the goodbye, and its BEGIN fails; adapter-pg then releases it with the error,
    // so its pool discards it, and the call begins again on another.
    transaction: (fn) => retryDeadStart(begin, fn),
  };
  return Object.freeze(executor);
}
