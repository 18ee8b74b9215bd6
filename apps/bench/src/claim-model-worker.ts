/**
 * One process of `--claim-model`: the candidate design for issue 25 in raw SQL, without the
 * scheduler — every process makes each tick's (job, tick) rows PENDING in one idempotent INSERT,
 * then its connections claim due rows with `FOR UPDATE SKIP LOCKED`, `batch` rows at a time, and
 * run them one of two ways (`run`):
 *
 * - `savepoint`: the rows claimed in one statement, the jobs' advisory locks tried in one (the
 *   overlap check), each job's empty handler between a SAVEPOINT and its RELEASE (as a failing job
 *   must roll back alone), and the rows marked SUCCEEDED in one UPDATE, all in one transaction (5
 *   statements and 2 per job). Its row lock keeps rivals off while the claiming transaction lives,
 *   and a claimant that dies rolls back, leaving the row PENDING.
 * - `chained`: as `savepoint`, but one round trip between two runs — the previous run's RELEASE and
 *   the next one's SAVEPOINT sent together (a simple query of two statements) — so a run costs one
 *   round trip, not two.
 * - `own`: the rows claimed RUNNING under this process's name in one committed statement, then
 *   each job in a transaction of its own (BEGIN; one UPDATE that finalises its row — still RUNNING
 *   and ours — and tries the job's advisory lock; the handler; COMMIT: 3 statements a job), as
 *   a scheduler whose every run commits its work with its ledger row alone would. A claimant that
 *   dies leaves its rows RUNNING, for a takeover this model does not measure.
 *
 * `connections` claimers per process (default 10). With `ahead` 1 the rows of tick T+1 are made
 * PENDING half a second before it, so that at T+1 the claimers only wake. A row is run exactly once
 * either way. On SIGTERM prints `{ starts, ran, readyAt, stoppedAt }` as the scale worker does.
 *
 * With a `slice` `i/n` (owned distribution's shape), the process makes PENDING and claims only the
 * rows of its own jobs, those with `job % n = i`: each job has one owner, and no process inserts
 * or skips over another's rows. `all`: every process does every job.
 *
 *   node claim-model-worker.mjs <database url> <table> <jobs> <name> [batch, default 1]
 *     [slice, default all] [run: savepoint (default) | chained | own] [connections, default 10] [ahead 0|1]
 */
import pg from 'pg';

const [url, table, jobsArg, name, batchArg, sliceArg, runArg, connectionsArg, aheadArg] =
  process.argv.slice(2) as [string, string, string, string, ...(string | undefined)[]];
const jobs = Number(jobsArg);
const batch = Number(batchArg ?? 1);
// This process's jobs: `job % slices = slice` (every job when no slice is given).
const [slice, slices] = (sliceArg === undefined || sliceArg === 'all' ? '0/1' : sliceArg)
  .split('/')
  .map(Number) as [number, number];
const run = runArg ?? 'savepoint';
if (run !== 'savepoint' && run !== 'chained' && run !== 'own')
  throw new Error(`run must be savepoint, chained or own: ${run}`);
const CONNECTIONS = Number(connectionsArg ?? 10);
const ahead = aheadArg === '1';
// One more connection than claimers: the materialising INSERT's.
const pool = new pg.Pool({ connectionString: url, max: CONNECTIONS + 1, application_name: name });
pool.on('error', () => {});
const starts: number[] = [];
const ran: number[] = [];
let stopping = false;
let wake: (() => void)[] = [];

/** Claims and runs due rows until none is left; returns when the table has none due. */
function claimLoop(client: pg.PoolClient): Promise<void> {
  return run === 'own' ? claimOwnLoop(client) : claimSavepointLoop(client, run === 'chained');
}

async function claimSavepointLoop(client: pg.PoolClient, chained: boolean): Promise<void> {
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
    for (const [i, row] of rows.entries()) {
      // Chained: the previous run's RELEASE goes with this run's SAVEPOINT (no parameters, so one
      // simple query may carry both).
      await client.query(
        chained && i > 0 ? 'RELEASE SAVEPOINT run; SAVEPOINT run' : 'SAVEPOINT run',
      );
      starts.push(Date.now() - row.tick.getTime());
      ran.push(row.job, row.tick.getTime() / 1000);
      if (!chained) await client.query('RELEASE SAVEPOINT run');
    }
    if (chained) await client.query('RELEASE SAVEPOINT run');
    await client.query(
      `UPDATE ${table} AS r SET status = 'SUCCEEDED'
         FROM unnest($1::int4[], $2::timestamptz[]) AS d(job, tick)
        WHERE r.job = d.job AND r.tick = d.tick`,
      [jobsOf, rows.map((r) => r.tick)],
    );
    await client.query('COMMIT');
  }
}

async function claimOwnLoop(client: pg.PoolClient): Promise<void> {
  for (;;) {
    if (stopping) return;
    const { rows } = await client.query<{ job: number; tick: Date }>(
      `UPDATE ${table} AS r SET status = 'RUNNING', owner = $4
         FROM (SELECT job, tick FROM ${table}
                WHERE status = 'PENDING' AND tick <= now() AND job % $2::int4 = $3::int4
                ORDER BY tick LIMIT $1 FOR UPDATE SKIP LOCKED) AS c
        WHERE r.job = c.job AND r.tick = c.tick
       RETURNING r.job, r.tick`,
      [batch, slices, slice, name],
    );
    if (rows.length === 0) return;
    for (const row of rows) {
      await client.query('BEGIN');
      const mine = await client.query(
        `UPDATE ${table} SET status = 'SUCCEEDED'
          WHERE job = $1 AND tick = $2 AND status = 'RUNNING' AND owner = $3
            AND pg_try_advisory_xact_lock(4242, $1)`,
        [row.job, row.tick, name],
      );
      if (mine.rowCount === 1) {
        starts.push(Date.now() - row.tick.getTime());
        ran.push(row.job, row.tick.getTime() / 1000);
      }
      await client.query('COMMIT');
    }
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
let materialiser: NodeJS.Timeout | undefined;
/** Makes the rows of the tick at `at` (ms) PENDING. */
const materialise = (at: number) =>
  pool.query(
    `INSERT INTO ${table} (job, tick, status)
     SELECT j, to_timestamp($1::float8 / 1000), 'PENDING' FROM generate_series(0, $2::int4 - 1) AS j
      WHERE j % $3::int4 = $4::int4
     ON CONFLICT DO NOTHING`,
    [at, jobs, slices, slice],
  );
let first = true;
const tick = async (): Promise<void> => {
  const at = Math.floor(Date.now() / 1000) * 1000;
  timer = setTimeout(() => void tick(), at + 1000 - Date.now());
  // Ahead: this tick's rows were made half a second ago (but the first tick's).
  if (!ahead || first) await materialise(at);
  first = false;
  if (ahead) materialiser = setTimeout(() => void materialise(at + 1000), 500);
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
  clearTimeout(materialiser);
  for (const w of wake) w();
  void Promise.all(workers).then(async () => {
    await pool.end();
    process.stdout.write(`${JSON.stringify({ starts, ran, readyAt, stoppedAt })}\n`, () =>
      process.exit(0),
    );
  });
});
