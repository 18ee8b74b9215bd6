/**
 * Knowing that a transaction's connection died, for a client that does not say so (Prisma exposes
 * no connection events). While tasks run, one query every `intervalMs` through the client's pool
 * asks the server which of their backends are gone; their signals then abort.
 */
import { type ConnectionFate, deadBackendsStatement } from '@lockkit/core/adapter';

/** A way to run one statement outside any transaction. */
export type RunStatement = (text: string, params: readonly unknown[]) => Promise<unknown>;

/** Watches backend pids while tasks run on them. */
export class BackendWatch {
  private readonly watched = new Map<number, Set<ConnectionFate>>();
  private timer: NodeJS.Timeout | undefined;
  private checking = false;

  constructor(
    private readonly run: RunStatement,
    private readonly intervalMs: number,
  ) {}

  /** Aborts `fate` when backend `pid` disappears; the returned function stops watching. */
  add(pid: number, fate: ConnectionFate): () => void {
    let set = this.watched.get(pid);
    if (!set) {
      set = new Set();
      this.watched.set(pid, set);
    }
    set.add(fate);
    this.timer ??= setInterval(() => void this.check(), this.intervalMs);
    this.timer.unref();
    return () => {
      set.delete(fate);
      if (set.size === 0) this.watched.delete(pid);
      if (this.watched.size === 0 && this.timer) {
        clearInterval(this.timer);
        this.timer = undefined;
      }
    };
  }

  private async check(): Promise<void> {
    if (this.checking || this.watched.size === 0) return;
    this.checking = true;
    try {
      const statement = deadBackendsStatement([...this.watched.keys()]);
      const rows = (await this.run(statement.text, statement.params)) as { pid: number }[];
      for (const { pid } of rows) {
        for (const fate of this.watched.get(Number(pid)) ?? []) {
          fate.abort(Object.assign(new Error(`backend ${pid} is gone`), { code: '57P01' }));
        }
      }
    } catch {
      // The check failing says nothing about the watched connections; try again next time.
    } finally {
      this.checking = false;
    }
  }
}
