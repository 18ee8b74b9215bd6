// Another process holding an advisory lock, for the CLI's tests: takes the session lock of the
// int4 pair in argv, prints its backend pid, and holds the lock until stdin closes.
import pg from 'pg';

const [url, k1, k2] = process.argv.slice(2);
const client = new pg.Client({
  connectionString: url,
  application_name: 'lockkit-cli-test-holder',
});
await client.connect();
await client.query('SELECT pg_advisory_lock($1::int4, $2::int4)', [Number(k1), Number(k2)]);
const { rows } = await client.query('SELECT pg_backend_pid() AS pid');
process.stdout.write(`${rows[0].pid}\n`);
process.stdin.resume();
process.stdin.on('end', async () => {
  await client.end();
  process.exit(0);
});
