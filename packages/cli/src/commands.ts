/**
 * The CLI's commands. Each reads what it needs through lockkit's core and prints a table, or JSON.
 */
import {
  type DoctorCheck,
  doctor,
  type Inspection,
  inspect,
  type KeyNames,
  LockKey,
  migrate,
} from '@lockkit/core';
import { pgExecutor } from '@lockkit/pg';
import pg from 'pg';
import { duration, table, when } from './table.js';

/** What every command gets. */
export interface CommandContext {
  readonly client: pg.Client;
  /** The connection string `client` was made from. */
  readonly url: string;
  readonly schema: string | undefined;
  readonly json: boolean;
  readonly names: KeyNames;
  readonly out: (text: string) => void;
}

const jsonOf = (value: unknown) =>
  JSON.stringify(value, (_k, v) =>
    typeof v === 'bigint' ? String(v) : v instanceof LockKey ? String(v) : v,
  );

const schemaOption = (schema: string | undefined) => (schema === undefined ? {} : { schema });

async function look(ctx: CommandContext): Promise<Inspection> {
  return inspect(pgExecutor(ctx.client), { ...schemaOption(ctx.schema), names: ctx.names });
}

/** Renders the lock table of an inspection. */
export function locksView(i: Inspection): string {
  const rows = i.locks.map((l) => [
    l.names ? `${l.names.namespace}/${l.names.jobKey}` : '(unknown name)',
    l.key.pair ? `(${l.key.pair[0]},${l.key.pair[1]})` : `int8 ${l.key.int8}`,
    l.mode,
    l.granted ? 'held' : 'WAITING',
    l.pid,
    l.blockedBy.length ? l.blockedBy.join(',') : '-',
    l.applicationName || '-',
    l.clientAddress ?? 'local',
    l.state,
    duration(l.transactionAgeMs),
    duration(l.waitingMs),
  ]);
  const c = i.capacity;
  return [
    rows.length === 0
      ? 'No advisory locks are held or awaited in this database.'
      : table(
          [
            'name',
            'key',
            'mode',
            'status',
            'pid',
            'blocked by',
            'application',
            'client',
            'state',
            'xact age',
            'waiting',
          ],
          rows,
        ),
    '',
    `lock table: ${c.used} of ${c.slots} slots in use (${(c.ratio * 100).toFixed(1)}%), ${c.advisory} advisory${c.warning ? '  WARNING: raise max_locks_per_transaction or release locks sooner' : ''}`,
  ].join('\n');
}

/** `lockkit locks` */
export async function locks(ctx: CommandContext): Promise<number> {
  const i = await look(ctx);
  ctx.out(ctx.json ? jsonOf({ locks: i.locks, capacity: i.capacity }) : locksView(i));
  return 0;
}

/** `lockkit leases` */
export async function leases(ctx: CommandContext): Promise<number> {
  const i = await look(ctx);
  if (ctx.json) ctx.out(jsonOf(i.leases));
  else if (i.leases.length === 0)
    ctx.out('No leases (or no lockkit tables in this schema: run lockkit migrate).');
  else
    ctx.out(
      table(
        [
          'lease',
          'token',
          'status',
          'held',
          'owner',
          'expires',
          'claimed',
          'finished',
          'attempts',
          'last error',
        ],
        i.leases.map((l) => [
          `${l.namespace}/${l.jobKey}`,
          l.token,
          l.status,
          l.held ? 'yes' : 'no',
          l.owner,
          when(l.expiresAt),
          when(l.claimedAt),
          when(l.finishedAt),
          l.attempts,
          l.lastError,
        ]),
      ),
    );
  return 0;
}

/** `lockkit runs` */
export async function runs(ctx: CommandContext): Promise<number> {
  const i = await look(ctx);
  if (ctx.json) {
    ctx.out(jsonOf({ jobs: i.jobs, recent: i.recentRuns }));
    return 0;
  }
  if (i.jobs.length === 0) {
    ctx.out(
      'No scheduled runs recorded (or no lockkit tables in this schema: run lockkit migrate).',
    );
    return 0;
  }
  const window = i.jobs[0]?.window ?? 0;
  ctx.out(
    [
      table(
        [
          'job',
          'last tick',
          'last success',
          'runs',
          'failed',
          'missed',
          'overlap',
          'abandoned',
          'running',
        ],
        i.jobs.map((j) => [
          j.job,
          when(j.lastTick),
          when(j.lastSuccess),
          j.ran,
          j.failed,
          j.missed,
          j.skippedOverlap,
          j.abandoned,
          j.running,
        ]),
      ),
      `(over each job's latest ${window} ledger rows; runs = ticks that ran: succeeded, failed, abandoned or running — missed and overlapping ticks are not runs)`,
      '',
      table(
        ['job', 'tick', 'status', 'attempt', 'ran by', 'error'],
        i.recentRuns
          .slice(0, 20)
          .map((r) => [r.job, when(r.tick), r.status, r.attempt, r.owner, r.error]),
      ),
    ].join('\n'),
  );
  return 0;
}

/** `lockkit key <namespace> <jobKey>`: both ints, where the lock shows in pg_locks, and the SQL to take it by hand. */
export function key(
  namespace: string,
  jobKey: string,
  json: boolean,
  out: (text: string) => void,
): number {
  const k = LockKey.fromNames(namespace, jobKey);
  const [k1, k2] = k.pair as readonly [number, number];
  const sql = {
    tryInTransaction: `SELECT pg_try_advisory_xact_lock(${k1}, ${k2});`,
    session: `SELECT pg_advisory_lock(${k1}, ${k2}); /* … */ SELECT pg_advisory_unlock(${k1}, ${k2});`,
    find: `SELECT * FROM pg_locks WHERE locktype = 'advisory' AND classid = ${k.pgLocks.classid} AND objid = ${k.pgLocks.objid} AND objsubid = 2;`,
  };
  if (json) out(jsonOf({ namespace, jobKey, key1: k1, key2: k2, pgLocks: k.pgLocks, sql }));
  else
    out(
      [
        `${namespace}/${jobKey}`,
        `  key1 ${k1}   key2 ${k2}`,
        `  pg_locks: classid ${k.pgLocks.classid}, objid ${k.pgLocks.objid}, objsubid 2`,
        `  take it in a transaction:  ${sql.tryInTransaction}`,
        `  take it for a session:     ${sql.session}`,
        `  find it:                   ${sql.find}`,
      ].join('\n'),
    );
  return 0;
}

/** `lockkit migrate` */
export async function runMigrate(ctx: CommandContext): Promise<number> {
  const result = await migrate(pgExecutor(ctx.client), schemaOption(ctx.schema));
  if (ctx.json) ctx.out(jsonOf(result));
  else if (result.applied.length === 0)
    ctx.out(`schema "${result.schema}" is up to date (version ${result.to})`);
  else
    ctx.out(
      `schema "${result.schema}": applied ${result.applied.join(', ')} (version ${result.from} → ${result.to})`,
    );
  return 0;
}

/** `lockkit doctor`: exit 1 when a check fails, 0 otherwise (warnings included). */
export async function runDoctor(ctx: CommandContext): Promise<number> {
  // A small pool of its own: telling a session-mode pooler from a transaction-mode one takes a
  // second connection while the first sits idle.
  const pool = new pg.Pool({
    connectionString: ctx.url,
    max: 3,
    application_name: 'lockkit-cli',
    connectionTimeoutMillis: 10_000,
  });
  pool.on('error', () => {});
  let checks: DoctorCheck[];
  try {
    checks = await doctor(pgExecutor(pool), schemaOption(ctx.schema));
  } finally {
    await pool.end();
  }
  if (ctx.json) ctx.out(jsonOf(checks));
  else
    ctx.out(
      checks
        .map(
          (c) =>
            `${c.level === 'ok' ? ' ok ' : c.level.toUpperCase().padEnd(4)}  ${c.id.padEnd(27)} ${c.message}`,
        )
        .join('\n'),
    );
  return checks.some((c) => c.level === 'fail') ? 1 : 0;
}

/** `lockkit watch`: the locks view, refreshed every `intervalMs`, `iterations` times (0: until Ctrl-C). */
export async function watch(
  ctx: CommandContext,
  intervalMs: number,
  iterations: number,
): Promise<number> {
  for (let i = 0; iterations === 0 || i < iterations; i++) {
    const view = locksView(await look(ctx));
    ctx.out(
      ctx.json
        ? jsonOf(await look(ctx))
        : `\x1b[2J\x1b[H${new Date().toISOString()}  (every ${intervalMs} ms, Ctrl-C to stop)\n\n${view}`,
    );
    if (iterations === 0 || i < iterations - 1) await new Promise((r) => setTimeout(r, intervalMs));
  }
  return 0;
}
