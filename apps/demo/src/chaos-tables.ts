/**
 * What a chaos run writes besides lockkit's own tables, and how it waits for the ledger: the
 * `executions` table (one row per run of a chaos job, written in the run's transaction or under
 * its lease's fence, with the attempt's own id) and `lease_writes` (the fenced rows of the lease
 * holder), and the wait until every judged tick is decided. Shared by `pnpm chaos` and its
 * `--failover` mode.
 */
import pg from 'pg';

/** Creates the chaos tables in `schema` (lockkit's migrations have created the schema). */
export async function createChaosTables(client: pg.Client, schema: string): Promise<void> {
  await client.query(
    `CREATE TABLE "${schema}".executions (job text NOT NULL, tick timestamptz NOT NULL, worker text NOT NULL,
       run_id text NOT NULL, executed_at timestamptz NOT NULL DEFAULT clock_timestamp())`,
  );
  await client.query(
    `CREATE TABLE "${schema}".lease_writes (id bigserial PRIMARY KEY, token bigint NOT NULL, worker text NOT NULL,
       written_at timestamptz NOT NULL DEFAULT clock_timestamp())`,
  );
}

/** Judged ticks (`jobs` × every second from `$2` to `$3`) nobody has run whose ledger row, if any, is not final. */
const undecided = (schema: string) => `
  SELECT count(*)::int AS n
    FROM unnest($1::text[]) AS j(job)
   CROSS JOIN generate_series($2::timestamptz, $3::timestamptz, interval '1 second') AS t(tick)
   WHERE NOT EXISTS (SELECT 1 FROM "${schema}".executions e WHERE e.job = j.job AND e.tick = t.tick)
     AND NOT EXISTS (SELECT 1 FROM "${schema}".runs r WHERE r.job = j.job AND r.tick = t.tick
                        AND r.status IN ('SUCCEEDED', 'FAILED', 'SKIPPED_OVERLAP', 'MISSED', 'ABANDONED'))`;

/**
 * Waits until every judged tick of `jobs` from `window.from` to `window.to` (ms, whole seconds) is
 * decided — run, or recorded with a final status — or `limitMs` has passed (the judge then counts
 * what is left as missed).
 */
export async function untilDecided(
  url: string,
  schema: string,
  jobs: readonly string[],
  window: { readonly from: number; readonly to: number },
  limitMs: number,
): Promise<void> {
  const client = new pg.Client({ connectionString: url, application_name: 'chaos-drain' });
  await client.connect();
  try {
    const deadline = Date.now() + limitMs;
    while (Date.now() < deadline) {
      const { rows } = await client.query<{ n: number }>(undecided(schema), [
        jobs,
        new Date(window.from),
        new Date(window.to),
      ]);
      if ((rows[0]?.n ?? 0) === 0) return;
      await new Promise((r) => setTimeout(r, 250));
    }
  } finally {
    await client.end();
  }
}
