#!/usr/bin/env node
/**
 * `lockkit`: see what is locked, leased and scheduled; create lockkit's tables; check a server.
 */
import { parseArgs } from 'node:util';
import { isLockkitError, KeyNames } from '@lockkit/core';
import { pgExecutor } from '@lockkit/pg';
import pg from 'pg';
import * as commands from './commands.js';
import { startDashboard } from './dashboard.js';
import { redact, redactCredentials } from './table.js';

const USAGE = `Usage: lockkit <command> [options]

Commands:
  locks                 advisory locks held or awaited, decoded to names, who blocks whom, lock-table use
  leases                leases: holders, tokens, expiries, last errors
  runs                  scheduled jobs: last runs, failures, missed ticks, recent ledger rows
  key <namespace> <job> the two int4 keys of a job, where it shows in pg_locks, SQL to take it by hand
  migrate               create or upgrade lockkit's tables (safe from many places at once)
  doctor                check the server: identity, real locks, standby, pooler, timeouts, keepalives, lock table, clock
  watch                 the locks view, refreshed (--interval ms, default 1000)
  dashboard             a live web page of locks, leases and runs (--port 4680, --host 127.0.0.1, --token)

Options:
  --url URL             PostgreSQL connection string (default: $DATABASE_URL)
  --schema NAME         schema of lockkit's tables (default: lockkit)
  --name NS/JOB         a name to decode keys with (repeatable); leases and scheduled jobs decode on their own
  --json                JSON for scripts instead of tables
  --interval MS         refresh period of watch
  --verbose             print stack traces on errors
  -h, --help            show this help
`;

const out = (text: string) => process.stdout.write(`${text}\n`);
const fail = (text: string, code: number) => {
  process.stderr.write(`lockkit: ${redactCredentials(text)}\n`);
  return code;
};

const OPTIONS = {
  url: { type: 'string' },
  schema: { type: 'string' },
  name: { type: 'string', multiple: true },
  json: { type: 'boolean' },
  interval: { type: 'string' },
  port: { type: 'string' },
  host: { type: 'string' },
  token: { type: 'string' },
  iterations: { type: 'string' },
  verbose: { type: 'boolean' },
  help: { type: 'boolean', short: 'h' },
} as const;

function parse(argv: readonly string[]) {
  return parseArgs({ args: [...argv], allowPositionals: true, options: OPTIONS });
}

/**
 * What `parse` refused, in one line naming the option. Read from parseArgs' tokens, not from its
 * message: that text changes between Node versions and (Node 20–24) ends on an unbalanced quote.
 */
function usageError(argv: readonly string[]): string {
  const { tokens } = parseArgs({
    args: [...argv],
    allowPositionals: true,
    options: OPTIONS,
    strict: false,
    tokens: true,
  });
  for (const token of tokens) {
    if (token.kind !== 'option') continue;
    const spec: { type: 'string' | 'boolean' } | undefined =
      OPTIONS[token.name as keyof typeof OPTIONS];
    if (!spec) return `unknown option ${token.rawName}`;
    if (spec.type === 'string' && token.value === undefined)
      return `${token.rawName} needs a value`;
    // parseArgs refuses `--port -1`: the value might be a forgotten option.
    if (spec.type === 'string' && !token.inlineValue && token.value?.startsWith('-'))
      return `${token.rawName} needs a value; one that starts with "-" is written ${token.rawName}=…`;
    if (spec.type === 'boolean' && token.value !== undefined)
      return `${token.rawName} takes no value`;
  }
  return 'could not read the arguments';
}

/** One clear line for what can go wrong when connecting or querying. */
function describe(error: unknown, url: string): string {
  const e = error as { code?: string; message?: string };
  switch (e.code) {
    case 'ECONNREFUSED':
    case 'ENOTFOUND':
    case 'EHOSTUNREACH':
    case 'ETIMEDOUT':
      return `cannot reach the server at ${redact(url)} (${e.code})`;
    case '3D000':
      return `the database in ${redact(url)} does not exist`;
    case '28P01':
    case '28000':
      return `the server refused the login for ${redact(url)}: ${e.message}`;
    default:
      return isLockkitError(error)
        ? `${error.code}: ${error.message}`
        : (e.message ?? String(error));
  }
}

async function main(argv: readonly string[]): Promise<number> {
  let parsed: ReturnType<typeof parse>;
  try {
    parsed = parse(argv);
  } catch {
    return fail(`${usageError(argv)} (try lockkit --help)`, 2);
  }
  const { values, positionals } = parsed;
  if (values.help) {
    out(USAGE);
    return 0;
  }
  const [command, ...rest] = positionals;
  if (!command) return fail(`no command given\n\n${USAGE}`, 2);
  const known = ['locks', 'leases', 'runs', 'key', 'migrate', 'doctor', 'watch', 'dashboard'];
  if (!known.includes(command)) return fail(`unknown command "${command}" (try lockkit --help)`, 2);
  const json = values.json === true;
  try {
    if (command === 'key') {
      if (rest.length !== 2) return fail('usage: lockkit key <namespace> <jobKey>', 2);
      return commands.key(rest[0] as string, rest[1] as string, json, out);
    }
    const names = new KeyNames();
    for (const name of values.name ?? []) {
      const slash = name.indexOf('/');
      if (slash <= 0) return fail(`--name takes NAMESPACE/JOB, got "${name}"`, 2);
      names.add(name.slice(0, slash), name.slice(slash + 1));
    }
    const url = values.url ?? process.env.DATABASE_URL;
    if (!url) return fail('no database: pass --url or set DATABASE_URL', 2);
    try {
      new URL(url);
    } catch {
      return fail('--url is not a valid URL (postgres://user@host:5432/database)', 2);
    }
    const client = new pg.Client({
      connectionString: url,
      application_name: 'lockkit-cli',
      connectionTimeoutMillis: 10_000,
    });
    client.on('error', () => {});
    try {
      await client.connect();
    } catch (error) {
      if (values.verbose)
        process.stderr.write(`${redactCredentials(String((error as Error).stack))}\n`);
      return fail(describe(error, url), 1);
    }
    try {
      const ctx = { client, url, schema: values.schema, json, names, out };
      switch (command) {
        case 'locks':
          return await commands.locks(ctx);
        case 'leases':
          return await commands.leases(ctx);
        case 'runs':
          return await commands.runs(ctx);
        case 'migrate':
          return await commands.runMigrate(ctx);
        case 'doctor':
          return await commands.runDoctor(ctx);
        case 'dashboard': {
          const port = Number(values.port ?? 4680);
          if (!Number.isInteger(port) || port < 0 || port > 65535)
            return fail('--port must be 0–65535', 2);
          const host = values.host ?? '127.0.0.1';
          if (!['127.0.0.1', 'localhost', '::1'].includes(host) && !values.token) {
            return fail(`--host ${host} is not loopback: pass --token to protect the dashboard`, 2);
          }
          const pool = new pg.Pool({
            connectionString: url,
            max: 2,
            application_name: 'lockkit-dashboard',
          });
          pool.on('error', () => {});
          const dashboard = await startDashboard({
            executor: pgExecutor(pool),
            host,
            port,
            names,
            ...(values.schema !== undefined && { schema: values.schema }),
            ...(values.token !== undefined && { token: values.token }),
          });
          out(`lockkit dashboard at ${dashboard.url} (Ctrl-C to stop)`);
          await new Promise<void>((resolve) => process.once('SIGINT', () => resolve()));
          await dashboard.close();
          await pool.end();
          return 0;
        }
        default: {
          const interval = Number(values.interval ?? 1000);
          const iterations = Number(values.iterations ?? 0);
          if (!Number.isInteger(interval) || interval < 100)
            return fail('--interval must be an integer ≥ 100', 2);
          return await commands.watch(ctx, interval, iterations);
        }
      }
    } finally {
      await client.end().catch(() => {});
    }
  } catch (error) {
    if (values.verbose)
      process.stderr.write(`${redactCredentials(String((error as Error).stack))}\n`);
    const code =
      isLockkitError(error) && (error.code === 'OPTION_INVALID' || error.code.startsWith('KEY_'))
        ? 2
        : 1;
    return fail(describe(error, values.url ?? process.env.DATABASE_URL ?? ''), code);
  }
}

main(process.argv.slice(2)).then((code) => {
  process.exitCode = code;
});
