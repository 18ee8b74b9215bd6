/**
 * CPU pinning for the 1-client rows: the bench process on one CPU, the servers it measures
 * (PostgreSQL's postmaster and every backend, Redis) on another, with `taskset`. Without it the
 * scheduler moves a lone client and its backend between CPUs and onto the same one, and a
 * 1-client ratio moves with it. Backends started while pinned inherit the postmaster's CPU.
 *
 * Only where it can be done honestly: Linux with `taskset`, at least 2 CPUs, and servers that are
 * processes of this machine (a loopback address, and a pid that names a postgres or redis process
 * here). Everything pinned is put back as it was by {@link Pinning.restore}.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { availableParallelism } from 'node:os';

/** The outcome of {@link pinApart}. */
export interface Pinning {
  /** Whether client and servers now run on different CPUs. */
  readonly pinned: boolean;
  /** What was done, or why not: for the report. */
  readonly note: string;
  /** Puts every pinned process back on the CPUs it had. */
  restore(): void;
}

/** A process's allowed CPUs, as `taskset -c` writes them (`0-1`). */
function cpusOf(pid: number): string | undefined {
  try {
    const status = readFileSync(`/proc/${pid}/status`, 'utf8');
    return /^Cpus_allowed_list:\s*(\S+)$/m.exec(status)?.[1];
  } catch {
    return undefined;
  }
}

function commandOf(pid: number): string {
  try {
    return readFileSync(`/proc/${pid}/comm`, 'utf8').trim();
  } catch {
    return '';
  }
}

function parentOf(pid: number): number | undefined {
  try {
    // Field 4 of /proc/<pid>/stat, after the parenthesised command (which may hold spaces).
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return Number(fields[1]);
  } catch {
    return undefined;
  }
}

function childrenOf(parent: number): number[] {
  const children: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    if (parentOf(Number(entry)) === parent) children.push(Number(entry));
  }
  return children;
}

function setCpus(pid: number, cpus: string): void {
  // -a: every thread of the process (Node's and libuv's included).
  execFileSync('taskset', ['-a', '-p', '-c', cpus, String(pid)], { stdio: 'ignore' });
}

/** Whether `url`'s host is this machine. */
export function isLocalUrl(url: string): boolean {
  try {
    const host = new URL(url).hostname.replace(/^\[|\]$/g, '');
    return host === '' || host === 'localhost' || host === '::1' || host.startsWith('127.');
  } catch {
    return false;
  }
}

/**
 * Pins this process to the last CPU, and PostgreSQL (found from one of its backends' pid) and
 * Redis (its own pid) to the first.
 */
export function pinApart(servers: {
  readonly postgresBackendPid: number | undefined;
  readonly postgresLocal: boolean;
  readonly redisPid: number | undefined;
}): Pinning {
  const nothing = (why: string): Pinning => ({
    pinned: false,
    note: `1-client rows not pinned: ${why}`,
    restore() {},
  });
  if (process.platform !== 'linux') return nothing('not Linux');
  if (availableParallelism() < 2) return nothing('fewer than 2 CPUs');
  try {
    execFileSync('taskset', ['-V'], { stdio: 'ignore' });
  } catch {
    return nothing('no taskset on this machine');
  }
  const backend = servers.postgresBackendPid;
  if (!servers.postgresLocal || backend === undefined || !existsSync(`/proc/${backend}`))
    return nothing('PostgreSQL is not a process of this machine');
  if (commandOf(backend) !== 'postgres')
    return nothing(`pid ${backend} is not a postgres process here`);
  const postmaster = parentOf(backend);
  if (postmaster === undefined || commandOf(postmaster) !== 'postgres')
    return nothing('no postmaster found above the backend');

  const serverCpu = '0';
  const clientCpu = String(availableParallelism() - 1);
  const previous = new Map<number, string>();
  const pin = (pid: number, cpus: string) => {
    const before = cpusOf(pid);
    if (before === undefined) return;
    setCpus(pid, cpus);
    if (!previous.has(pid)) previous.set(pid, before);
  };
  const restore = () => {
    for (const [pid, cpus] of previous) {
      try {
        setCpus(pid, cpus);
      } catch {
        // The process has gone (a backend whose connection closed): nothing to put back.
      }
    }
    // Backends forked while the postmaster was pinned inherited its CPU: give them its old set.
    const postmasterCpus = previous.get(postmaster);
    if (postmasterCpus) {
      for (const child of childrenOf(postmaster)) {
        if (!previous.has(child) && cpusOf(child) === serverCpu) {
          try {
            setCpus(child, postmasterCpus);
          } catch {
            // gone meanwhile
          }
        }
      }
    }
    previous.clear();
  };
  try {
    pin(postmaster, serverCpu);
    for (const child of childrenOf(postmaster)) pin(child, serverCpu);
    const redis = servers.redisPid;
    const redisLocal = redis !== undefined && commandOf(redis).startsWith('redis');
    if (redisLocal) pin(redis, serverCpu);
    const redisNote = redisLocal ? ', Redis' : '';
    pin(process.pid, clientCpu);
    return {
      pinned: true,
      note: `1-client rows pinned with taskset: this process on CPU ${clientCpu}; PostgreSQL${redisNote} on CPU ${serverCpu}`,
      restore,
    };
  } catch (error) {
    restore();
    return nothing(`taskset failed (${(error as Error).message.split('\n')[0]})`);
  }
}
