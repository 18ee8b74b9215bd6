/**
 * doctor() against a real server: the checks read what the server really does, not what a
 * setting's text looks like.
 */
import { testDatabaseBaseUrl } from '@lockkit/test-db';
import pg from 'pg';
import { afterEach, describe, expect, it } from 'vitest';
import { doctor } from '../src/doctor.js';
import { clientExecutor } from './client-executor.js';

const clients: pg.Client[] = [];
afterEach(async () => {
  await Promise.all(clients.splice(0).map((c) => c.end()));
});

async function connect(options: string | undefined): Promise<pg.Client> {
  const client = new pg.Client({
    connectionString: testDatabaseBaseUrl(),
    ...(options !== undefined && { options }),
  });
  await client.connect();
  clients.push(client);
  return client;
}

describe('doctor(): TCP keepalives', () => {
  it('warns when tcp_keepalives_idle is left at 0, the OS default (2 hours on Linux)', async () => {
    const client = await connect(undefined);
    const { rows } = await client.query(
      "SELECT reset_val FROM pg_settings WHERE name = 'tcp_keepalives_idle'",
    );
    // The premise: this server leaves it unset (Postgres's default).
    expect(rows[0].reset_val).toBe('0');
    const checks = await doctor(clientExecutor(client));
    const keepalive = checks.find((c) => c.id === 'tcp-keepalive');
    expect(keepalive?.level).toBe('warn');
    expect(keepalive?.message).toMatch(/OS default/);
  });

  it('passes a short keepalive, and warns about a long one', async () => {
    const short = await doctor(clientExecutor(await connect('-c tcp_keepalives_idle=60')));
    expect(short.find((c) => c.id === 'tcp-keepalive')).toMatchObject({
      level: 'ok',
      message: expect.stringContaining('60 s'),
    });
    const long = await doctor(clientExecutor(await connect('-c tcp_keepalives_idle=3600')));
    expect(long.find((c) => c.id === 'tcp-keepalive')).toMatchObject({
      level: 'warn',
      message: expect.stringContaining('3600 s'),
    });
  });
});
