/**
 * One process of the scale run's ceiling: what this server commits beside the same number of Node
 * processes when each transaction is as small as a scheduled run can be — BEGIN, the job's
 * advisory transaction lock, one row inserted, COMMIT (4 round trips) — on a pool of 10, as the
 * scale workers use. On SIGTERM it prints `{ commits, readyAt, stoppedAt }`.
 *
 *   node ceiling-worker.mjs <database url> <table> <name>
 */
import pg from 'pg';

const [url, table, name] = process.argv.slice(2) as [string, string, string];
const CONNECTIONS = 10;
const pool = new pg.Pool({ connectionString: url, max: CONNECTIONS, application_name: name });
pool.on('error', () => {});
let commits = 0;
let stopping = false;
let serial = 0;
const loop = async (slot: number): Promise<void> => {
  const client = await pool.connect();
  try {
    while (!stopping) {
      const n = serial++;
      await client.query('BEGIN');
      await client.query('SELECT pg_try_advisory_xact_lock($1, $2)', [slot, n % 1000]);
      await client.query(`INSERT INTO ${table} (owner, n) VALUES ($1, $2)`, [name, n]);
      await client.query('COMMIT');
      commits++;
    }
  } finally {
    client.release();
  }
};
// Every connection open before the window starts.
const clients = await Promise.all(Array.from({ length: CONNECTIONS }, () => pool.connect()));
for (const c of clients) c.release();
const loops = Array.from({ length: CONNECTIONS }, (_, slot) => loop(slot));
const readyAt = Date.now();
commits = 0;
process.stdout.write(`${JSON.stringify({ ready: true, readyAt })}\n`);
process.once('SIGTERM', () => {
  const stoppedAt = Date.now();
  const total = commits;
  stopping = true;
  void Promise.all(loops).then(async () => {
    await pool.end();
    process.stdout.write(`${JSON.stringify({ commits: total, readyAt, stoppedAt })}\n`, () =>
      process.exit(0),
    );
  });
});
