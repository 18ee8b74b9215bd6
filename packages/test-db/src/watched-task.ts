/**
 * A lock task that watches its own signal while it works outside the database, and the
 * application's own transaction holding a connection of the same pool: the two halves of every
 * "is a task told its connection died while the pool is busy" test, whatever the adapter.
 */

/** What a lock task's context offers that these tests use (any lockkit `TransactionContext`). */
export interface WatchedTaskContext {
  query(text: string): Promise<readonly Record<string, unknown>[]>;
  readonly signal: AbortSignal;
}

/** The lock call of an adapter's lock client: `(task) => locks.withLock(key, task, options)`. */
export type WatchedLockCall = (
  task: (tx: unknown, ctx: WatchedTaskContext) => Promise<string>,
) => Promise<unknown>;

/** A task started by {@link watchedTask}. */
export interface WatchedTask {
  /** Its backend's pid, once it runs. */
  readonly pid: Promise<number>;
  /** Whether its signal fired before it gave up on its own (WATCHDOG_MS). */
  readonly told: Promise<boolean>;
  /** The call's result, or its error's code (else the error as a string). */
  readonly call: Promise<unknown>;
  /** Ends its work (it returns 'done'). */
  finish(): void;
  /** Whether its signal had fired (undefined before it ran). */
  aborted(): boolean | undefined;
}

/** Only ends a failing run: a passing one is told long before. */
export const WATCHDOG_MS = 10_000;

/**
 * Starts `lockCall` with a task that reports its backend pid, then works outside the database (an
 * HTTP call, a queue) until its signal fires or {@link WatchedTask.finish} is called. With
 * `givesUp`, it gives up after {@link WATCHDOG_MS}. `finish` is also pushed on `releases`: a
 * failing run leaves the task working, and the pool's close would wait for it.
 */
export function watchedTask(
  lockCall: WatchedLockCall,
  releases: (() => void)[],
  givesUp = true,
): WatchedTask {
  let pidOf!: (pid: number) => void;
  const pid = new Promise<number>((resolve) => {
    pidOf = resolve;
  });
  let toldOf!: (told: boolean) => void;
  const told = new Promise<boolean>((resolve) => {
    toldOf = resolve;
  });
  let signal: AbortSignal | undefined;
  let finish!: () => void;
  const finished = new Promise<void>((resolve) => {
    finish = resolve;
  });
  releases.push(finish);
  const call = lockCall(async (_tx, ctx) => {
    const [row] = await ctx.query('SELECT pg_backend_pid() AS pid');
    signal = ctx.signal;
    pidOf(Number(row?.pid));
    await new Promise<void>((resolve) => {
      const watchdog = setTimeout(
        () => {
          toldOf(false);
          resolve();
        },
        givesUp ? WATCHDOG_MS : 2 ** 31 - 1,
      );
      ctx.signal.addEventListener('abort', () => {
        clearTimeout(watchdog);
        toldOf(true);
        resolve();
      });
      void finished.then(() => {
        clearTimeout(watchdog);
        resolve();
      });
    });
    return 'done';
  }).then(
    (r) => r,
    (error: unknown) => {
      const code = (error as { code?: unknown } | null)?.code;
      return typeof code === 'string' ? code : String(error);
    },
  );
  return { pid, told, call, finish, aborted: () => signal?.aborted };
}

/**
 * The application's own transaction holding one connection of the pool until released: `start`
 * opens it, runs a statement, calls `holding`, then waits for `released`. Resolves once it holds;
 * `release` is also pushed on `releases` (a failing run would leave it open).
 */
export async function appHoldsConnection(
  start: (holding: () => void, released: Promise<void>) => Promise<unknown>,
  releases: (() => void)[],
): Promise<{ release: () => void; done: Promise<unknown> }> {
  let release!: () => void;
  const released = new Promise<void>((resolve) => {
    release = resolve;
  });
  releases.push(release);
  let holding!: () => void;
  const held = new Promise<void>((resolve) => {
    holding = resolve;
  });
  const done = start(holding, released);
  await held;
  return { release, done };
}
