/**
 * Backends terminated while each runs a statement of a lockkit call, round after round — the
 * scenario in which postgres.js keeps the terminated backend's FATAL and hands it to the next
 * request its slot reconnects for. Each round holds one call per pool slot in `pg_sleep(30)` on the
 * server, terminates all of those backends from another connection, then (optionally) runs the
 * application's own queries, one per slot, then asks lockkit for every slot at once: a lost slot
 * leaves one of those waiting for ever (bounded here). Each adapter's test gives its own calls.
 */
import pg from 'pg';

/** What a lock call's task gets: a way to send a statement on the call's own connection. */
export interface StatementRunner {
  query(text: string): Promise<readonly unknown[]>;
}

/** The scenario's inputs. */
export interface TerminatedRoundsOptions {
  /** The server the pool is on (an admin connection to it finds and terminates the backends). */
  readonly url: string;
  /** The pool's `application_name`: how its sleeping backends are found. */
  readonly applicationName: string;
  readonly poolSize: number;
  readonly rounds: number;
  /** A lockkit call (e.g. `withLock` on a key named by `label`) running `task` on its connection. */
  lockCall(
    label: string,
    task: (ctx: StatementRunner) => Promise<unknown>,
  ): Promise<{ readonly executed: boolean }>;
  /** The application's own query on the same pool, made after each termination. */
  appQuery?(): Promise<unknown>;
}

/** How one round went: each list has one entry per pool slot. */
export interface TerminatedRound {
  /** The terminated calls: their error's code, or 'ran'. */
  readonly terminated: readonly string[];
  /** The application's queries: 'ran', or the error's code and message. */
  readonly app: readonly string[];
  /** The next lockkit calls, all slots at once: 'ran', 'skipped', the error, or 'never settled'. */
  readonly next: readonly string[];
}

const NEVER = 'never settled';

/** `promise`, or `late` after `ms` (a bound on a call that would otherwise never settle). */
const bounded = <T>(promise: Promise<T>, late: T, ms: number): Promise<T> =>
  Promise.race([promise, new Promise<T>((resolve) => setTimeout(() => resolve(late), ms).unref())]);

const described = (error: unknown): string => {
  const e = error as { code?: unknown; message?: unknown } | null | undefined;
  return `${String(e?.code ?? 'error')}: ${String(e?.message ?? error)}`;
};

/**
 * The round every adapter must show: each terminated call rejects `CONNECTION_LOST`, and every
 * query after it runs.
 */
export function expectedRound(poolSize: number, withApp: boolean): TerminatedRound {
  const all = (v: string) => Array.from({ length: poolSize }, () => v);
  return { terminated: all('CONNECTION_LOST'), app: withApp ? all('ran') : [], next: all('ran') };
}

/**
 * Runs the rounds; stops after the first that differs from {@link expectedRound} (a lost slot
 * would make every later round wait out its bound), so a failing run shows that round last.
 */
export async function terminatedRounds(
  options: TerminatedRoundsOptions,
): Promise<TerminatedRound[]> {
  const { poolSize } = options;
  const expected = JSON.stringify(expectedRound(poolSize, options.appQuery !== undefined));
  const admin = new pg.Client({ connectionString: options.url });
  await admin.connect();
  const sleeping = async () =>
    (
      await admin.query<{ pid: number }>(
        `SELECT pid FROM pg_stat_activity
          WHERE application_name = $1 AND state = 'active' AND query LIKE '%pg_sleep(30)%'`,
        [options.applicationName],
      )
    ).rows.map((r) => r.pid);
  const slots = <T>(f: (i: number) => Promise<T>) =>
    Promise.all(Array.from({ length: poolSize }, (_, i) => f(i)));
  const rounds: TerminatedRound[] = [];
  try {
    for (let round = 0; round < options.rounds; round++) {
      const calls = slots((i) =>
        options
          .lockCall(`${round}-${i}`, async (ctx) => {
            await ctx.query('SELECT pg_sleep(30)');
          })
          .then(
            () => 'ran',
            (error: { code?: string }) => error.code ?? 'error',
          ),
      );
      // Every call's statement on the server (polled: the only sign of it is pg_stat_activity).
      let pids: number[] = [];
      for (let tries = 0; tries < 2_500 && pids.length < poolSize; tries++) {
        pids = await sleeping();
        if (pids.length < poolSize) await new Promise((r) => setTimeout(r, 2));
      }
      if (pids.length < poolSize) {
        throw new Error(`round ${round}: ${pids.length} of ${poolSize} slots reached pg_sleep`);
      }
      await admin.query('SELECT pg_terminate_backend(pid) FROM unnest($1::int4[]) AS pid', [pids]);
      const terminated = await calls;
      const appQuery = options.appQuery;
      const app =
        appQuery === undefined
          ? []
          : await bounded(
              slots(() => appQuery().then(() => 'ran', described)),
              [NEVER],
              10_000,
            );
      // Every slot at once: each task waits until all have entered.
      let entered = 0;
      let open!: () => void;
      const all = new Promise<void>((resolve) => {
        open = resolve;
      });
      const next = await bounded(
        slots((i) =>
          options
            .lockCall(`next-${round}-${i}`, async (ctx) => {
              await ctx.query('SELECT 1 AS one');
              entered++;
              if (entered === poolSize) open();
              await all;
            })
            .then((r) => (r.executed ? 'ran' : 'skipped'), described),
        ),
        [NEVER],
        10_000,
      );
      const outcome: TerminatedRound = { terminated, app, next };
      rounds.push(outcome);
      if (JSON.stringify(outcome) !== expected) break;
    }
    return rounds;
  } finally {
    await admin.end();
  }
}
