/**
 * `--js-cost`: lockkit's own JavaScript per decision, without a server. `@lockkit/pg` runs over a
 * fake pool whose one client answers every statement at once (a try-lock that is granted, or
 * refused for the skip rows), so what is timed is the library and the adapter, not the network or
 * PostgreSQL. The numbers barely move with the machine's load, so a change to the hot path shows
 * even on a busy machine, where the × floor rows of the main run drown it.
 *
 * `LOCKKIT_BENCH_COMPARE=<path to another build's packages/pg/dist/index.mjs>` loads that build
 * too and interleaves its rounds with this one's: before and after a change, in one process.
 */
import { EventEmitter } from 'node:events';
import { pathToFileURL } from 'node:url';
import * as current from '@lockkit/pg';

/** What `createLockKit` of a `@lockkit/pg` build needs from us. */
interface PgBuild {
  createLockKit(pool: unknown): {
    runExclusiveJob(namespace: string, job: string, task: () => Promise<void>): Promise<unknown>;
  };
}

/** A client answering lockkit's statements at once, with the protocol events pg emits. */
class InstantClient {
  readonly connection = new EventEmitter();
  readonly processID = 7;
  readonly secretKey = 9;
  readonly host = '127.0.0.1';
  readonly port = 5432;
  private status = 'I';

  constructor(private readonly granted: boolean) {}

  getTransactionStatus(): string {
    return this.status;
  }

  on(): this {
    return this;
  }

  release(): void {}

  async query(text: string): Promise<unknown> {
    if (text.startsWith('BEGIN;')) {
      this.status = 'T';
      this.connection.emit('readyForQuery', { status: 'T' });
      // The columns of the opening try-lock, as a primary answers them.
      const row = { pid: 7, acquired: this.granted, began: '1.5', in_recovery: false };
      return [
        { command: 'BEGIN', rows: [] },
        { command: 'SELECT', rows: [row] },
      ];
    }
    if (text === 'COMMIT' || text === 'ROLLBACK') {
      this.status = 'I';
      this.connection.emit('commandComplete', { text });
      this.connection.emit('readyForQuery', { status: 'I' });
      return { command: text, rows: [] };
    }
    return { command: 'SELECT', rows: [] };
  }
}

/** A pool of `max` connections (as pg reports it) that always lends the same instant client. */
function instantPool(max: number, granted: boolean) {
  const client = new InstantClient(granted);
  return { options: { max }, totalCount: 1, connect: async () => client };
}

/** One row: µs per decision for each build, median of the rounds. */
export interface JsCostRow {
  readonly row: string;
  readonly microseconds: Record<string, number>;
}

/** Measures every row for this build (and the compared one, when given). */
export async function measureJsCost(): Promise<JsCostRow[]> {
  const builds: Record<string, PgBuild> = { current: current as unknown as PgBuild };
  const compare = process.env.LOCKKIT_BENCH_COMPARE;
  if (compare) builds.compared = (await import(pathToFileURL(compare).href)) as PgBuild;
  const rows = [
    { row: 'run decision, pool of 16', max: 16, granted: true },
    { row: 'skip decision, pool of 16', max: 16, granted: false },
    { row: 'run decision, pool of one (nested-call guard on)', max: 1, granted: true },
  ];
  const perRound = 20_000;
  const rounds = 7;
  const result: JsCostRow[] = [];
  for (const { row, max, granted } of rows) {
    const kits = Object.entries(builds).map(
      ([name, build]) => [name, build.createLockKit(instantPool(max, granted))] as const,
    );
    const samples: Record<string, number[]> = {};
    const task = async () => {};
    for (let round = -1; round < rounds; round++) {
      for (const [name, kit] of kits) {
        const started = performance.now();
        for (let i = 0; i < perRound; i++) await kit.runExclusiveJob('bench', 'job', task);
        const us = ((performance.now() - started) * 1000) / perRound;
        if (round < 0) continue; // round -1 warms up
        const list = samples[name] ?? [];
        list.push(us);
        samples[name] = list;
      }
    }
    const microseconds: Record<string, number> = {};
    for (const [name, values] of Object.entries(samples)) {
      values.sort((a, b) => a - b);
      microseconds[name] = values[Math.floor(values.length / 2)] as number;
    }
    result.push({ row, microseconds });
  }
  return result;
}
