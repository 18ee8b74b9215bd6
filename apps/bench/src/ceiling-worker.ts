/**
 * One process of the ceiling probe: the machine's own limit for small scheduler-like transactions
 * beside the other processes. `loops` concurrent loops over a pool of 10 connections, each
 * `BEGIN; SELECT pg_try_advisory_xact_lock(k); INSERT … ON CONFLICT DO NOTHING; COMMIT` (4
 * statements, one row, one advisory lock — the skeleton of a tick's claim) until SIGTERM; then
 * one JSON line with how many transactions committed.
 *
 *   node ceiling-worker.mjs <database url> <schema> <name> <loops>
 */
import pg from 'pg';

const [url, schema, name, loops] = process.argv.slice(2) as [string, string, string, string];
const pool = new pg.Pool({ connectionString: url, max: 10, application_name: `ceiling-${name}` });
pool.on('error', () => {});
let committed = 0;
let stopping = false;
let n = 0;
const loop = async (id: number) => {
  while (!stopping) {
    const client = await pool.connect();
    try {
      const key = `${name}-${id}-${n++}`;
      await client.query('BEGIN');
      await client.query('SELECT pg_try_advisory_xact_lock(hashtext($1))', [key]);
      await client.query(
        `INSERT INTO "${schema}".ceiling (key, at) VALUES ($1, now()) ON CONFLICT DO NOTHING`,
        [key],
      );
      await client.query('COMMIT');
      committed++;
    } finally {
      client.release();
    }
  }
};
process.stdout.write(`${JSON.stringify({ ready: true })}\n`);
const running = Array.from({ length: Number(loops) }, (_, i) => loop(i));
process.on('SIGUSR2', () => {
  process.stdout.write(`${JSON.stringify({ mark: { committed, at: Date.now() } })}\n`);
});
process.once('SIGTERM', () => {
  stopping = true;
  void Promise.allSettled(running).then(async () => {
    await pool.end();
    process.exit(0);
  });
});
