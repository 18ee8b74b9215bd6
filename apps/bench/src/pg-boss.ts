/**
 * The pg-boss row: what "exactly one of us does this" costs when it is built from a Postgres job
 * queue instead of a lock. One decision is one singleton job cycle on a `stately` queue (at most
 * one job per state): `send` with a singleton key (a skip is `send` answering null because the job
 * is already queued), `fetch` (the job goes active), `complete`. Each of the three is its own
 * committed write, so each waits for a WAL flush — the cost this row exists to show.
 *
 * pg-boss keeps its tables in a schema of its own; the bench gives it a fresh one and drops it.
 */
import { randomBytes } from 'node:crypto';
import pg from 'pg';
import PgBoss from 'pg-boss';

/** A started pg-boss with one queue per client, and how to clean it away. */
export interface PgBossPeer {
  /** One singleton job cycle on client `client`'s queue (or on the shared one when `hot`). */
  cycle(client: number, hot?: boolean): Promise<void>;
  /** Queues client `client`'s job without taking it, so that the next cycle there is a skip. */
  park(client: number): Promise<void>;
  /** Stops pg-boss and drops its schema. */
  close(): Promise<void>;
}

/**
 * Starts pg-boss against `url` in a fresh schema, with its maintenance and cron timers off so
 * that only the measured calls reach the server.
 */
export async function startPgBossPeer(url: string, clients: number): Promise<PgBossPeer> {
  const schema = `pgboss_bench_${randomBytes(4).toString('hex')}`;
  const boss = new PgBoss({
    connectionString: url,
    schema,
    max: clients,
    supervise: false,
    schedule: false,
    migrate: true,
  });
  boss.on('error', () => {});
  await boss.start();
  const queue = (client: number) => `lockkit-bench-${client}`;
  for (let client = 0; client < clients; client++) {
    await boss.createQueue(queue(client), { name: queue(client), policy: 'stately' });
  }
  await boss.createQueue('lockkit-bench-hot', { name: 'lockkit-bench-hot', policy: 'stately' });
  return {
    async cycle(client, hot = false) {
      const name = hot ? 'lockkit-bench-hot' : queue(client);
      const id = await boss.send(name, {}, { singletonKey: 'job', retryLimit: 0 });
      if (id === null) return; // skip: the job is already queued elsewhere
      const [job] = await boss.fetch(name);
      if (job) await boss.complete(name, job.id);
    },
    async park(client) {
      await boss.send(queue(client), {}, { singletonKey: 'job', retryLimit: 0 });
    },
    async close() {
      await boss.stop({ graceful: false, wait: true, close: true });
      const admin = new pg.Client({ connectionString: url });
      await admin.connect();
      try {
        await admin.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
      } finally {
        await admin.end();
      }
    },
  };
}
