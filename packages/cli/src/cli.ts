#!/usr/bin/env node
/**
 * `lockkit`: the command line of lockkit.
 *
 *   lockkit migrate [--url URL] [--schema NAME]   create or upgrade lockkit's tables
 *
 * The database comes from --url, else DATABASE_URL.
 */
import { parseArgs } from 'node:util';
import { isLockkitError, migrate } from '@lockkit/core';
import { pgExecutor } from '@lockkit/pg';
import pg from 'pg';

const USAGE = `Usage: lockkit <command> [options]

Commands:
  migrate    create or upgrade lockkit's tables (leases) — safe to run from many places at once

Options:
  --url URL        PostgreSQL connection string (default: $DATABASE_URL)
  --schema NAME    schema of lockkit's tables (default: lockkit)
  --json           print the result as JSON
  -h, --help       show this help
`;

/** Runs the CLI with `argv` (without node and script); resolves to the exit code. */
async function main(
  argv: readonly string[],
  out = process.stdout,
  err = process.stderr,
): Promise<number> {
  let parsed: ReturnType<typeof parse>;
  try {
    parsed = parse(argv);
  } catch (error) {
    err.write(`${(error as Error).message}\n\n${USAGE}`);
    return 2;
  }
  const { values, positionals } = parsed;
  if (values.help || positionals.length === 0) {
    (values.help ? out : err).write(USAGE);
    return values.help ? 0 : 2;
  }
  const [command] = positionals;
  if (command !== 'migrate') {
    err.write(`Unknown command: ${command}\n\n${USAGE}`);
    return 2;
  }
  const url = values.url ?? process.env.DATABASE_URL;
  if (!url) {
    err.write('No database: pass --url or set DATABASE_URL.\n');
    return 2;
  }
  const pool = new pg.Pool({ connectionString: url, max: 1, application_name: 'lockkit-cli' });
  pool.on('error', () => {});
  try {
    const result = await migrate(
      pgExecutor(pool),
      values.schema === undefined ? {} : { schema: values.schema },
    );
    if (values.json) out.write(`${JSON.stringify(result)}\n`);
    else if (result.applied.length === 0)
      out.write(`schema "${result.schema}" is up to date (version ${result.to})\n`);
    else
      out.write(
        `schema "${result.schema}": applied ${result.applied.join(', ')} (version ${result.from} → ${result.to})\n`,
      );
    return 0;
  } catch (error) {
    err.write(
      `lockkit migrate failed: ${isLockkitError(error) ? `${error.code}: ` : ''}${(error as Error).message}\n`,
    );
    return isLockkitError(error) && error.code === 'OPTION_INVALID' ? 2 : 1;
  } finally {
    await pool.end();
  }
}

function parse(argv: readonly string[]) {
  return parseArgs({
    args: [...argv],
    allowPositionals: true,
    options: {
      url: { type: 'string' },
      schema: { type: 'string' },
      json: { type: 'boolean' },
      help: { type: 'boolean', short: 'h' },
    },
  });
}

main(process.argv.slice(2)).then((code) => {
  process.exitCode = code;
});
