/**
 * What the dashboard's lock samples saw over the last seconds. A transaction-scoped lock often
 * lives for milliseconds, so "locks held now" is nearly always empty; sampled several times a
 * second and remembered for a while, the locks that come and go show up, with who held them.
 */
import type { KeyNames, LockSample, SampledLock } from '@lockkit/core';

/** One backend seen holding or awaiting a lock. */
export interface SeenHolder {
  readonly pid: number;
  readonly applicationName: string | null;
  readonly clientAddress: string | null;
  readonly granted: boolean;
  /** When it was last seen, ms since the epoch. */
  readonly lastSeen: number;
}

/** One lock (key and mode) seen in the window. */
export interface SeenLock {
  /** The key as text: `(k1,k2)`, or the int8 ({@link keyText}). */
  readonly key: string;
  readonly names: { readonly namespace: string; readonly jobKey: string } | undefined;
  readonly mode: 'exclusive' | 'shared';
  readonly firstSeen: number;
  readonly lastSeen: number;
  /** Samples in which it was held. */
  readonly heldSamples: number;
  /** Samples in which someone waited for it. */
  readonly waitingSamples: number;
  /** Held in the latest sample. */
  readonly heldNow: boolean;
  /** Awaited in the latest sample. */
  readonly waitingNow: boolean;
  /** The backends seen on it, most recent first (at most {@link MAX_HOLDERS}). */
  readonly holders: readonly SeenHolder[];
}

/** A key as the same text whether or not its names are known: `(k1,k2)`, or the int8. */
export function keyText(key: SampledLock['key']): string {
  return key.pair ? `(${key.pair[0]},${key.pair[1]})` : String(key.int8);
}

interface Entry {
  key: string;
  lockKey: SampledLock['key'];
  names: SeenLock['names'];
  mode: SeenLock['mode'];
  firstSeen: number;
  lastSeen: number;
  heldSamples: number;
  waitingSamples: number;
  seenAt: number;
  holders: Map<string, SeenHolder>;
}

/** How many recent backends a lock keeps. */
export const MAX_HOLDERS = 5;

/** The locks seen in the last `windowMs`, fed one sample at a time. */
export class LockHistory {
  private readonly entries = new Map<string, Entry>();
  private latest = 0;

  constructor(private readonly windowMs: number) {}

  /** Adds one sample and forgets what is older than the window. */
  record(sample: LockSample): void {
    const at = sample.at.getTime();
    this.latest = at;
    for (const lock of sample.locks) {
      const key = keyText(lock.key);
      const id = `${key}/${lock.mode}`;
      let entry = this.entries.get(id);
      if (!entry) {
        entry = {
          key,
          lockKey: lock.key,
          names: lock.names,
          mode: lock.mode,
          firstSeen: at,
          lastSeen: at,
          heldSamples: 0,
          waitingSamples: 0,
          seenAt: -1,
          holders: new Map(),
        };
        this.entries.set(id, entry);
      }
      entry.names ??= lock.names;
      // Several backends on one lock in one sample (shared holders, waiters) count once.
      if (entry.seenAt !== at) {
        entry.seenAt = at;
        entry.lastSeen = at;
      }
      if (lock.granted) entry.heldSamples++;
      else entry.waitingSamples++;
      const holderId = `${lock.pid}/${lock.granted}`;
      entry.holders.delete(holderId); // re-inserted last: the map keeps most recent last
      entry.holders.set(holderId, {
        pid: lock.pid,
        applicationName: lock.applicationName,
        clientAddress: lock.clientAddress,
        granted: lock.granted,
        lastSeen: at,
      });
      while (entry.holders.size > MAX_HOLDERS) {
        entry.holders.delete(entry.holders.keys().next().value as string);
      }
    }
    const horizon = at - this.windowMs;
    for (const [id, entry] of this.entries) if (entry.lastSeen < horizon) this.entries.delete(id);
  }

  /**
   * The locks seen in the window, most recently seen first; names looked up again in `names`
   * (a lease or job learned after the lock was first seen decodes it too).
   */
  recent(names?: KeyNames): SeenLock[] {
    return [...this.entries.values()]
      .sort((a, b) => b.lastSeen - a.lastSeen || a.key.localeCompare(b.key))
      .map((e) => {
        const holders = [...e.holders.values()].reverse();
        const now = e.seenAt === this.latest;
        return {
          key: e.key,
          names: e.names ?? names?.lookup(e.lockKey),
          mode: e.mode,
          firstSeen: e.firstSeen,
          lastSeen: e.lastSeen,
          heldSamples: e.heldSamples,
          waitingSamples: e.waitingSamples,
          heldNow: now && holders.some((h) => h.granted && h.lastSeen === this.latest),
          waitingNow: now && holders.some((h) => !h.granted && h.lastSeen === this.latest),
          holders,
        };
      });
  }
}
