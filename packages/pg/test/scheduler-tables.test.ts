/**
 * The scheduler keeps its jobs, schedules and strings as rows of typed-array tables (ce809ab).
 * What it writes to the ledger through @lockkit/pg on a hand clock, compared with values computed
 * here independently (names, expressions and time zones as given; schedule hashes by their
 * documented recipe), and the inputs an outside review of that change found it mishandled: a cron
 * expression longer than `String.fromCharCode.apply` takes, and `runTick` of a name no job could
 * have (both seen failing on ce809ab, passing on the object-graph scheduler before it).
 */
import { createHash, randomBytes } from 'node:crypto';
import { createScheduler, type SchedulerEvent, SimulatedClock } from '@lockkit/core';
import { testDatabaseUrl } from '@lockkit/test-db';
import pg from 'pg';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { createLockKit } from '../src/index.js';

const schema = `lockkit_scheduler_tables_${randomBytes(4).toString('hex')}`;
let pool: pg.Pool;
beforeAll(async () => {
  pool = new pg.Pool({ connectionString: testDatabaseUrl(), max: 8 });
  await createLockKit(pool, { schema }).migrate();
});
afterAll(async () => {
  await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
  await pool.end();
});

/** The ledger's schedule hash, by the recipe (timezone, newline, expression, optional rule). */
function hashOf(cron: string, timezone: string, domAndDow = false): string {
  const reading = `${timezone}\n${cron}${domAndDow ? '\ndom-and-dow' : ''}`;
  return createHash('sha256').update(reading, 'utf8').digest().toString('hex', 0, 8);
}

const noop = () => {};

it('start() registers each job with its name, expression, zone and hash as given', async () => {
  const locks = createLockKit(pool, { schema });
  const s = createScheduler(locks, { owner: 'reg', namespace: 'reg' });
  const jobs: [string, string, { timezone?: string; domAndDow?: boolean }][] = [
    ['plain', '0 * * * * *', {}],
    ['ümlaut-é', '0 0 * * * *', { timezone: 'Europe/Oslo' }],
    ['astral-😀-𝔘', '*/5 * * * * *', {}],
    ['quote"back\\slash', '0\t0  *   * * *', {}],
    ['line\u2028sep\u2029', '0 0 12 L * *', { timezone: 'Etc/UTC' }],
    ['ctl\n\t\r\b', '0 0 9 1-7 * 1', { domAndDow: true }],
    ['bom\ufeff', '0 0 9 1-7 * 1', {}],
    ['utc-named', '0 * * * * *', { timezone: 'UTC' }],
    ['year', '0 0 0 1 1 * 2099', {}],
    ['x'.repeat(1024), '0 * * * * *', {}],
  ];
  for (const [name, cron, options] of jobs) s.register(name, cron, noop, options);
  await s.start();
  await s.stop({ timeoutMs: 1 }).catch(() => {});
  // stop() removes the registrations: start a second instance and read them while it is live.
  const t = createScheduler(locks, { owner: 'reg2', namespace: 'reg' });
  for (const [name, cron, options] of jobs) t.register(name, cron, noop, options);
  await t.start();
  const { rows } = await pool.query(
    `SELECT job, cron, timezone, schedule_hash FROM "${schema}".schedules WHERE owner = 'reg2' ORDER BY job COLLATE "C"`,
  );
  await t.stop({ timeoutMs: 5000 });
  const expected = jobs
    .map(([name, cron, o]) => ({
      job: name,
      cron,
      timezone: o.timezone ?? 'UTC',
      schedule_hash: hashOf(cron, o.timezone ?? 'UTC', o.domAndDow),
    }))
    .sort((a, b) => (Buffer.from(a.job) < Buffer.from(b.job) ? -1 : 1));
  expect(rows).toEqual(expected);
});

/** Resolves once `count` events of `type` have been seen from `s` since the call. */
function events(s: ReturnType<typeof createScheduler>, all: SchedulerEvent[]) {
  const waiters: { type: string; n: number; resolve: () => void }[] = [];
  const seen = new Map<string, number>();
  const check = () => {
    for (const w of [...waiters])
      if ((seen.get(w.type) ?? 0) >= w.n) {
        waiters.splice(waiters.indexOf(w), 1);
        w.resolve();
      }
  };
  for (const type of ['ran', 'failed', 'missed', 'error', 'skipped-done', 'skipped-held'] as const)
    s.on(type, (e: SchedulerEvent) => {
      all.push(e);
      seen.set(type, (seen.get(type) ?? 0) + 1);
      check();
    });
  return (type: string, n: number) =>
    new Promise<void>((resolve) => {
      waiters.push({ type, n, resolve });
      check();
    });
}

it('300 distinct schedules firing in one second, then an outage: every tick once, holes MISSED', async () => {
  const locks = createLockKit(pool, { schema });
  const T0 = Date.UTC(2026, 0, 1, 0, 0, 30);
  const clock = new SimulatedClock(T0);
  const s = createScheduler(locks, { clock, retentionMs: 0, owner: 'lru', namespace: 'lru' });
  const all: SchedulerEvent[] = [];
  const until = events(s, all);
  const N = 300;
  const names: string[] = [];
  for (let j = 0; j < N; j++) {
    const name = `lru-${j}-${'😀'.repeat(j % 3)}`;
    names.push(name);
    // Distinct expressions, all of them every minute at second 0.
    s.register(name, `0 0-59,${j % 60} 0-23,${Math.floor(j / 60)} * * *`, noop);
  }
  await s.start();
  let ran = 0;
  for (const minute of [1, 2]) {
    await clock.advanceTo(Date.UTC(2026, 0, 1, 0, minute));
    ran += N;
    await until('ran', ran);
  }
  clock.jump(Date.UTC(2026, 0, 1, 0, 10, 30) - clock.now());
  await clock.advanceTo(Date.UTC(2026, 0, 1, 0, 10, 30));
  await clock.advanceTo(Date.UTC(2026, 0, 1, 0, 11));
  await until('missed', N);
  await until('ran', ran + 2 * N);
  await s.stop({ timeoutMs: 10_000 });
  const { rows } = await pool.query(
    `SELECT job, tick, status FROM "${schema}".runs WHERE job LIKE 'lru-%' ORDER BY job, tick`,
  );
  const byJob = new Map<string, string[]>();
  for (const r of rows)
    byJob.set(r.job, [
      ...(byJob.get(r.job) ?? []),
      `${new Date(r.tick).toISOString().slice(11, 16)} ${r.status}`,
    ]);
  const first = byJob.get(names[0] as string);
  expect(byJob.size).toBe(N);
  for (const name of names) expect(byJob.get(name), name).toEqual(first);
  expect(first).toMatchInlineSnapshot(`
    [
      "00:01 SUCCEEDED",
      "00:02 SUCCEEDED",
      "00:03 MISSED",
      "00:04 MISSED",
      "00:05 MISSED",
      "00:06 MISSED",
      "00:07 MISSED",
      "00:08 MISSED",
      "00:09 MISSED",
      "00:10 SUCCEEDED",
      "00:11 SUCCEEDED",
    ]
  `);
  expect(all.filter((e) => e.type !== 'ran' && e.type !== 'missed')).toEqual([]);
}, 120_000);

it('schedule-conflict between two live instances, at start and for a job registered after start', async () => {
  const locks = createLockKit(pool, { schema });
  const one = createScheduler(locks, { owner: 'c1', namespace: 'conf' });
  const two = createScheduler(locks, { owner: 'c2', namespace: 'conf' });
  const seen: SchedulerEvent[] = [];
  two.on('schedule-conflict', (e) => seen.push(e));
  const specs: [string, string, string | undefined, string, string | undefined][] = [
    ['same-utc', '0 * * * * *', undefined, '0 * * * * *', 'UTC'],
    ['etc-utc-😀', '0 * * * * *', undefined, '0 * * * * *', 'Etc/UTC'],
    ['spaces-é', '0 * * * * *', undefined, '0  * * * * *', undefined],
    ['zone', '0 0 3 * * *', 'Europe/Oslo', '0 0 3 * * *', 'Europe/Berlin'],
  ];
  for (const [name, c1, z1] of specs)
    one.register(name, c1, noop, z1 === undefined ? {} : { timezone: z1 });
  one.register('late', '0 0 * * * *', noop);
  await one.start();
  for (const [name, , , c2, z2] of specs)
    two.register(name, c2, noop, z2 === undefined ? {} : { timezone: z2 });
  await two.start();
  const late = new Promise<void>((resolve) =>
    two.on('schedule-conflict', (e) => e.job === 'late' && resolve()),
  );
  two.register('late', '0 30 * * * *', noop);
  await late;
  await Promise.all([one.stop({ timeoutMs: 5000 }), two.stop({ timeoutMs: 5000 })]);
  expect(seen).toEqual([
    {
      type: 'schedule-conflict',
      job: 'etc-utc-😀',
      schedules: [
        { owner: 'c1', cron: '0 * * * * *', timezone: 'UTC' },
        { owner: 'c2', cron: '0 * * * * *', timezone: 'Etc/UTC' },
      ],
    },
    {
      type: 'schedule-conflict',
      job: 'spaces-é',
      schedules: [
        { owner: 'c1', cron: '0 * * * * *', timezone: 'UTC' },
        { owner: 'c2', cron: '0  * * * * *', timezone: 'UTC' },
      ],
    },
    {
      type: 'schedule-conflict',
      job: 'zone',
      schedules: [
        { owner: 'c1', cron: '0 0 3 * * *', timezone: 'Europe/Oslo' },
        { owner: 'c2', cron: '0 0 3 * * *', timezone: 'Europe/Berlin' },
      ],
    },
    {
      type: 'schedule-conflict',
      job: 'late',
      schedules: [
        { owner: 'c1', cron: '0 0 * * * *', timezone: 'UTC' },
        { owner: 'c2', cron: '0 30 * * * *', timezone: 'UTC' },
      ],
    },
  ]);
});

it('a job whose (valid) cron expression is 130,000 characters long is registered and runs', async () => {
  const locks = createLockKit(pool, { schema });
  const clock = new SimulatedClock(Date.UTC(2026, 0, 1, 0, 0, 30));
  const s = createScheduler(locks, { clock, retentionMs: 0, owner: 'long', namespace: 'long' });
  // Every minute at second 0, written out long (a generated list; croner and 734179b take it).
  const cron = `${Array(65_000).fill('0').join(',')} * * * * *`;
  expect(cron.length).toBeGreaterThan(130_000);
  const ran = new Promise<Date>((resolve) => s.on('ran', (e) => resolve(e.tick)));
  const errors: unknown[] = [];
  s.on('error', (e) => errors.push(e.error));
  s.register('long-cron', cron, noop);
  await s.start();
  const { rows } = await pool.query(
    `SELECT job, length(cron) AS n FROM "${schema}".schedules WHERE owner = 'long'`,
  );
  // start() swallows a failed registration (retried each minute, failing again each time).
  expect.soft(rows, 'registration row').toEqual([{ job: 'long-cron', n: cron.length }]);
  // On the system clock this throw escapes a setTimeout callback: an uncaught exception.
  const advanced = await clock.advanceTo(Date.UTC(2026, 0, 1, 0, 1)).then(
    () => 'advanced',
    (e: unknown) => String(e),
  );
  expect(advanced).toBe('advanced');
  expect((await ran).toISOString()).toBe('2026-01-01T00:01:00.000Z');
  await s.stop({ timeoutMs: 5000 });
  expect(errors).toEqual([]);
}, 60_000);

it('runTick of a name no job has, that is not a storable job name, rejects OPTION_INVALID (no job)', async () => {
  const locks = createLockKit(pool, { schema });
  const s = createScheduler(locks, { owner: 'rt', namespace: 'rt' });
  s.register('a', '* * * * * *', noop);
  const tick = new Date(Date.UTC(2026, 0, 1, 0, 0, 1));
  const codes: string[] = [];
  for (const name of ['', 'a\u0000', 'half \ud800 pair', 'x'.repeat(2000), 'no-such-job'])
    codes.push(
      await s.runTick(name, tick).then(
        () => 'resolved',
        (e) => `${e.name} ${e.code}`,
      ),
    );
  expect(codes).toEqual(Array(5).fill('LockkitError OPTION_INVALID'));
});
