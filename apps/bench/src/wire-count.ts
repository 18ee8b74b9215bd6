/**
 * What one process sends its PostgreSQL server, counted in the client: round trips (query calls),
 * SQL statements (a simple-protocol string may carry several, `;`-separated) and transactions (an
 * explicit BEGIN … COMMIT/ROLLBACK is one; a statement outside one is its own). Installed on
 * node-postgres's `Client.prototype.query`, so every pool and client of the process is counted.
 */
import pg from 'pg';

/** The counts since the last {@link WireCount.reset}. */
export interface WireTotals {
  readonly roundTrips: number;
  readonly statements: number;
  readonly transactions: number;
}

/**
 * The statements of a simple-protocol string: split on `;` outside quotes ('…', "…") and
 * dollar-quoted bodies, empty pieces dropped.
 */
export function splitStatements(text: string): string[] {
  const out: string[] = [];
  let start = 0;
  let i = 0;
  while (i < text.length) {
    const c = text[i];
    if (c === "'" || c === '"') {
      const close = text.indexOf(c, i + 1);
      i = close === -1 ? text.length : close + 1;
      continue;
    }
    if (c === '$') {
      const tag = /^\$[A-Za-z_]*\$/.exec(text.slice(i));
      if (tag) {
        const close = text.indexOf(tag[0], i + tag[0].length);
        i = close === -1 ? text.length : close + tag[0].length;
        continue;
      }
    }
    if (c === ';') {
      out.push(text.slice(start, i));
      start = i + 1;
    }
    i++;
  }
  out.push(text.slice(start));
  return out.map((s) => s.trim()).filter((s) => s !== '');
}

const BEGINS = /^(BEGIN|START\s+TRANSACTION)\b/i;
const ENDS = /^(COMMIT|END|ROLLBACK|ABORT)\b(?!\s+TO\b)(?!\s+PREPARED\b)/i;

/** The counter of one process (see the module comment). */
export class WireCount {
  private roundTrips = 0;
  private statements = 0;
  private transactions = 0;
  /** By client: inside an explicit transaction block. */
  private readonly open = new WeakSet<object>();
  /** With tracing on: how often each statement (its first 100 characters, spaces squeezed) was sent. */
  readonly trace: Map<string, number> | undefined;

  private constructor(trace: boolean) {
    this.trace = trace ? new Map() : undefined;
  }

  /** Wraps `pg.Client.prototype.query` (once per process); `trace` also counts each statement. */
  static install(trace = false): WireCount {
    const count = new WireCount(trace);
    const proto = pg.Client.prototype as unknown as {
      query: (this: object, ...args: unknown[]) => unknown;
    };
    const original = proto.query;
    proto.query = function (this: object, ...args: unknown[]) {
      const [first] = args;
      const text =
        typeof first === 'string'
          ? first
          : typeof (first as { text?: unknown } | null)?.text === 'string'
            ? (first as { text: string }).text
            : undefined;
      if (text !== undefined) count.saw(this, text);
      return original.apply(this, args);
    };
    return count;
  }

  private saw(client: object, text: string): void {
    this.roundTrips++;
    for (const statement of splitStatements(text)) {
      this.statements++;
      if (this.trace !== undefined) {
        const head = statement.replace(/\s+/g, ' ').slice(0, 100);
        this.trace.set(head, (this.trace.get(head) ?? 0) + 1);
      }
      if (BEGINS.test(statement)) {
        this.open.add(client);
        this.transactions++;
      } else if (ENDS.test(statement)) {
        this.open.delete(client);
      } else if (!this.open.has(client)) {
        this.transactions++;
      }
    }
  }

  /** The counts so far, and zero from now on. */
  reset(): WireTotals {
    const totals = this.totals();
    this.roundTrips = 0;
    this.statements = 0;
    this.transactions = 0;
    this.trace?.clear();
    return totals;
  }

  totals(): WireTotals {
    return {
      roundTrips: this.roundTrips,
      statements: this.statements,
      transactions: this.transactions,
    };
  }
}
