/**
 * What the test servers (embedded Postgres, PgBouncer) need from the operating system: the user
 * they run as, and a free loopback port.
 */
import { execFileSync } from 'node:child_process';
import { createServer } from 'node:net';
import { userInfo } from 'node:os';

/** The uid and gid a server process runs as (none: as this process). */
export interface Ids {
  readonly uid?: number;
  readonly gid?: number;
}

/**
 * As root, the ids of the `postgres` user (created when missing): neither Postgres nor PgBouncer
 * will run as root. Otherwise none: run as this user.
 */
export function postgresUserIds(): Ids {
  if (userInfo().uid !== 0) return {};
  const read = (flag: string) => Number(execFileSync('id', [flag, 'postgres']).toString().trim());
  try {
    return { uid: read('-u'), gid: read('-g') };
  } catch {
    // Postgres refuses to run as root: make the user it can run as.
    execFileSync('useradd', ['--system', '--user-group', '--no-create-home', 'postgres']);
    return { uid: read('-u'), gid: read('-g') };
  }
}

/** A TCP port that was free on 127.0.0.1 a moment ago. */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.on('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      server.close(() => {
        if (address && typeof address === 'object') resolve(address.port);
        else reject(new Error('no port'));
      });
    });
  });
}
