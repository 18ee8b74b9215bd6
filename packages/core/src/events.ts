/**
 * Typed events for every lock and lease outcome, for logging, metrics and tracing. A client made
 * without `onEvent` builds none of them.
 *
 * @packageDocumentation
 */
import {
  AfterCommitError,
  ConnectionLostError,
  LockTimeoutError,
  TransactionExpiredError,
} from './errors.js';
import type { LockKey } from './keys.js';
import type { LockMode, LockScope } from './sql/locks.js';

/** Fields every lock event carries. */
export interface LockEventBase {
  /** Correlates the events of one operation. */
  readonly id: number;
  readonly key: LockKey;
  readonly scope: LockScope;
  readonly mode: LockMode;
}

/** Every lock and lease outcome lockkit reports through `onEvent`. */
export type LockkitEvent =
  | (LockEventBase & { readonly type: 'lock-attempt'; readonly wait: boolean })
  | (LockEventBase & { readonly type: 'lock-acquired'; readonly waitedMs: number })
  | (LockEventBase & { readonly type: 'lock-skipped'; readonly waitedMs: number })
  | (LockEventBase & { readonly type: 'lock-timed-out'; readonly waitedMs: number })
  | (LockEventBase & {
      readonly type: 'lock-failed';
      readonly waitedMs: number;
      readonly error: unknown;
    })
  | (LockEventBase & {
      readonly type: 'lock-released';
      readonly heldMs: number;
      /** committed: the task succeeded (also when something after COMMIT failed: `AFTER_COMMIT_FAILED`); rolled-back: it threw; lost: the connection or transaction died under it. */
      readonly outcome: 'committed' | 'rolled-back' | 'lost';
    })
  | {
      readonly type: 'lease-claimed';
      readonly namespace: string;
      readonly jobKey: string;
      readonly token: bigint;
      readonly tookOver: boolean;
    }
  | {
      readonly type: 'lease-renewed';
      readonly namespace: string;
      readonly jobKey: string;
      readonly token: bigint;
    }
  | {
      readonly type: 'lease-lost';
      readonly namespace: string;
      readonly jobKey: string;
      readonly token: bigint;
      readonly reason: string;
    }
  | {
      readonly type: 'lease-finished';
      readonly namespace: string;
      readonly jobKey: string;
      readonly token: bigint;
      readonly failed: boolean;
      readonly heldMs: number;
    };

/** A listener of {@link LockkitEvent}s. Its errors are swallowed. */
export type LockkitEventListener = (event: LockkitEvent) => void;

/** Emits to a listener, never letting its failure reach lock logic. */
export function emitter(
  listener: LockkitEventListener | undefined,
): ((event: LockkitEvent) => void) | undefined {
  if (!listener) return undefined;
  return (event) => {
    try {
      listener(event);
    } catch {
      // A broken listener must not break a lock.
    }
  };
}

let sequence = 0;

/** Follows one lock operation and reports its outcomes; a no-op without a listener. */
export interface OperationTracker {
  acquired(): void;
  skipped(): void;
  settled(error: unknown): void;
}

const NOOP: OperationTracker = { acquired() {}, skipped() {}, settled() {} };

/** Starts following one operation. */
export function track(
  emit: ((event: LockkitEvent) => void) | undefined,
  key: LockKey,
  scope: LockScope,
  mode: LockMode,
  wait: boolean,
): OperationTracker {
  if (!emit) return NOOP;
  const base = { id: ++sequence, key, scope, mode };
  const started = performance.now();
  let acquiredAt: number | undefined;
  emit({ ...base, type: 'lock-attempt', wait });
  return {
    acquired() {
      acquiredAt = performance.now();
      emit({ ...base, type: 'lock-acquired', waitedMs: acquiredAt - started });
    },
    skipped() {
      emit({ ...base, type: 'lock-skipped', waitedMs: performance.now() - started });
    },
    settled(error) {
      if (acquiredAt === undefined) {
        const waitedMs = performance.now() - started;
        if (error instanceof LockTimeoutError) emit({ ...base, type: 'lock-timed-out', waitedMs });
        else if (error !== undefined) emit({ ...base, type: 'lock-failed', waitedMs, error });
        return;
      }
      const lost = error instanceof ConnectionLostError || error instanceof TransactionExpiredError;
      emit({
        ...base,
        type: 'lock-released',
        heldMs: performance.now() - acquiredAt,
        outcome:
          error === undefined || error instanceof AfterCommitError
            ? 'committed'
            : lost
              ? 'lost'
              : 'rolled-back',
      });
    },
  };
}
