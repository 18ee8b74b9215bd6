/**
 * One process of `--claim-model`: the candidate design for issue 25 in raw SQL, without the
 * scheduler — every process makes each tick's (job, tick) rows PENDING in one idempotent INSERT,
 * then its 10 connections claim due rows with `FOR UPDATE SKIP LOCKED`, `batch` rows per
 * transaction: the rows claimed in one statement, the jobs' advisory locks tried in one (the
 * overlap check), each job's empty handler between a SAVEPOINT and its RELEASE (as a failing job
 * must roll back alone), and the rows marked SUCCEEDED in one UPDATE, all in that transaction (5
 * statements and 2 per job). A row is run exactly once: its row lock keeps rivals off while the
 * claiming transaction lives, and a claimant that dies rolls back, leaving it PENDING. On SIGTERM
 * prints `{ starts, ran, readyAt, stoppedAt }` as the scale worker does.
 *
 * With a `slice` `i/n` (owned distribution's shape), the process makes PENDING and claims only the
 * rows of its own jobs, those with `job % n = i`: each job has one owner, and no process inserts
 * or skips over another's rows. Without one, every process does every job.
 *
 *   node claim-model-worker.mjs <database url> <table> <jobs> <name> [batch, default 1] [slice]
 */
import pg from 'pg';

const [url, table, jobsArg, name, batchArg, sliceArg] = process.argv.slice(2) as [
  string,
  string,
  string,
  string,
  string | undefined,
  string | undefined,
];
const jobs = Number(jobsArg);
const batch = Number(batchArg ?? 1);
// This process's jobs: `job % slices = slice` (every job when no slice is given).
const [slice, slices] = (sliceArg ?? '0/1').split('/').map(Number) as [number, number];
const CONNECTIONS = 10;
// One more connection than claimers: the materialising INSERT's.
const pool = new pg.Pool({ connectionString: url, max: CONNECTIONS + 1, application_name: name });
pool.on('error', () => {});
const starts: number[] = [];
const ran: number[] = [];
let stopping = false;
let wake: (() => void)[] = [];

/** Claims and runs due rows until none is left; returns when the table has none due. */
async function claimLoop(client: pg.PoolClient): Promise<void> {
  for (;;) {
    if (stopping) return;
    await client.query('BEGIN');
    const { rows } = await client.query<{ job: number; tick: Date }>(
      `SELECT job, tick FROM ${table}
        WHERE status = 'PENDING' AND tick <= now() AND job % $2::int4 = $3::int4
        ORDER BY tick LIMIT $1 FOR UPDATE SKIP LOCKED`,
      [batch, slices, slice],
    );
    if (rows.length === 0) {
      await client.query('COMMIT');
      return;
    }
    const jobsOf = rows.map((r) => r.job);
    await client.query(
      'SELECT pg_try_advisory_xact_lock(4242, j) FROM unnest($1::int4[]) AS j ORDER BY j',
      [jobsOf],
    );
    for (const row of rows) {
      await client.query('SAVEPOINT run');
      starts.push(Date.now() - row.tick.getTime());
      ran.push(row.job, row.tick.getTime() / 1000);
      await client.query('RELEASE SAVEPOINT run');
    }
    await client.query(
      `UPDATE ${table} AS r SET status = 'SUCCEEDED'
         FROM unnest($1::int4[], $2::timestamptz[]) AS d(job, tick)
        WHERE r.job = d.job AND r.tick = d.tick`,
      [jobsOf, rows.map((r) => r.tick)],
    );
    await client.query('COMMIT');
  }
}

/** One connection: at each tick's wake-up, claims until nothing is due. */
async function worker(): Promise<void> {
  const client = await pool.connect();
  try {
    while (!stopping) {
      await new Promise<void>((resolve) => wake.push(resolve));
      await claimLoop(client);
    }
  } finally {
    client.release();
  }
}

const workers = Array.from({ length: CONNECTIONS }, () => worker());
let timer: NodeJS.Timeout | undefined;
const tick = async (): Promise<void> => {
  const at = Math.floor(Date.now() / 1000) * 1000;
  timer = setTimeout(() => void tick(), at + 1000 - Date.now());
  await pool.query(
    `INSERT INTO ${table} (job, tick, status)
     SELECT j, to_timestamp($1::float8 / 1000), 'PENDING' FROM generate_series(0, $2::int4 - 1) AS j
      WHERE j % $3::int4 = $4::int4
     ON CONFLICT DO NOTHING`,
    [at, jobs, slices, slice],
  );
  const woken = wake;
  wake = [];
  for (const w of woken) w();
};
const readyAt = Date.now();
process.stdout.write(`${JSON.stringify({ ready: true, readyAt })}\n`);
timer = setTimeout(() => void tick(), 1000 - (Date.now() % 1000));
process.once('SIGTERM', () => {
  const stoppedAt = Date.now();
  stopping = true;
  clearTimeout(timer);
  for (const w of wake) w();
  void Promise.all(workers).then(async () => {
    await pool.end();
    process.stdout.write(`${JSON.stringify({ starts, ran, readyAt, stoppedAt })}\n`, () =>
      process.exit(0),
    );
  });
});
