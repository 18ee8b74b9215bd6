/**
 * Memory: the resident set of a process holding a lock client over a pool of 16 open connections,
 * and of one whose scheduler has 10,000 jobs registered and started (on one shared schedule, and on
 * 10,000 distinct schedules), against the same bare process — each measured in its own child process (`memory-probe.mjs`), so that nothing else in
 * the bench counts.
 */
import { execFileSync } from 'node:child_process';
import type { Probe } from './memory-probe.js';

/**
 * One process's memory in MB: its peak resident set (up to and including the reading after a
 * full GC); resident set, and live JavaScript memory (heap used + external), after a full GC;
 * `settled`, the same after 10 s of idling (V8 has shrunk its young generation).
 */
export interface ProcessMemory {
  /** The kernel's high-water mark of the resident set (`maxRSS`) up to the first reading. */
  readonly peakRssMb: number;
  readonly rssMb: number;
  readonly liveMb: number;
  readonly settled: { readonly rssMb: number; readonly liveMb: number };
}

/** The four processes measured. */
export interface MemoryReport {
  readonly bare: ProcessMemory;
  readonly pool16: ProcessMemory;
  /** 10,000 jobs on one shared hourly schedule. */
  readonly scheduler10k: ProcessMemory;
  /** 10,000 jobs, each on a cron expression of its own. */
  readonly scheduler10kDistinct: ProcessMemory;
}

/** Runs each probe in a child process and reports its memory. */
export function measureMemory(url: string, probeScript: string): MemoryReport {
  const round = (n: number) => Math.round(n * 10) / 10;
  const run = (kind: Probe): ProcessMemory => {
    const m = JSON.parse(
      execFileSync(process.execPath, ['--expose-gc', probeScript, kind, url], { encoding: 'utf8' }),
    ) as ProcessMemory;
    return {
      peakRssMb: round(m.peakRssMb),
      rssMb: round(m.rssMb),
      liveMb: round(m.liveMb),
      settled: { rssMb: round(m.settled.rssMb), liveMb: round(m.settled.liveMb) },
    };
  };
  return {
    bare: run('bare'),
    pool16: run('pool16'),
    scheduler10k: run('scheduler10k'),
    scheduler10kDistinct: run('scheduler10kDistinct'),
  };
}
