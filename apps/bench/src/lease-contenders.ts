/**
 * The contenders of the lease renewal bench, in a process of their own so that their JavaScript
 * does not crowd the holder's event loop: `count` loops claim the same lease back to back, for
 * `ms` milliseconds. Says READY once its connections are open, then prints one JSON line
 * `{ "claims": n, "executed": n }` and exits.
 *
 * Usage: node lease-contenders.mjs <url> <schema> <namespace> <jobKey> <count> <ms>
 */
import { createLockKit } from '@lockkit/pg';
import pg from 'pg';

async function main(): Promise<void> {
  const [url, schema, namespace, jobKey, countText, msText] = process.argv.slice(2);
  const count = Number(countText);
  const ms = Number(msText);
  const pool = new pg.Pool({ connectionString: url, max: Math.max(1, count) });
  pool.on('error', () => {});
  const locks = createLockKit(pool, { schema: schema as string });
  await Promise.all(Array.from({ length: count }, () => pool.query('SELECT 1')));
  process.stdout.write('READY\n');
  // The parent says when to start: it has started recording.
  await new Promise((resolve) => process.stdin.once('data', resolve));
  let claims = 0;
  let executed = 0;
  const until = performance.now() + ms;
  await Promise.all(
    Array.from({ length: count }, async () => {
      while (performance.now() < until) {
        const r = await locks.runWithLease(namespace as string, jobKey as string, async () => {});
        claims++;
        if (r.executed) executed++;
      }
    }),
  );
  process.stdout.write(`${JSON.stringify({ claims, executed })}\n`);
  await pool.end();
}

main().catch((error: unknown) => {
  process.stderr.write(`${String(error)}\n`);
  process.exitCode = 1;
});
