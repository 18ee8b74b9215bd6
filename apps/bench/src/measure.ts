/**
 * Runs one scenario with N concurrent clients for a fixed time and reports throughput and
 * latency percentiles.
 */

/** One operation of a scenario, run by client number `client`. */
export type Operation = (client: number) => Promise<unknown>;

/** What one timed run measured. */
export interface Measurement {
  readonly operations: number;
  readonly seconds: number;
  readonly latenciesMs: number[];
}

/** Runs `operation` on `clients` concurrent loops for `ms` milliseconds. */
export async function measure(
  operation: Operation,
  clients: number,
  ms: number,
): Promise<Measurement> {
  const latenciesMs: number[] = [];
  const started = performance.now();
  const deadline = started + ms;
  await Promise.all(
    Array.from({ length: clients }, async (_, client) => {
      while (performance.now() < deadline) {
        const t0 = performance.now();
        await operation(client);
        latenciesMs.push(performance.now() - t0);
      }
    }),
  );
  return {
    operations: latenciesMs.length,
    seconds: (performance.now() - started) / 1000,
    latenciesMs,
  };
}

/**
 * The median of several runs of one scenario by throughput (the middle one of three): a round
 * that a CPU-placement hiccup slowed or sped up does not move the result.
 */
export function median(runs: readonly Measurement[]): Measurement {
  if (runs.length === 0) throw new Error('no runs to take the median of');
  const sorted = [...runs].sort((a, b) => a.operations / a.seconds - b.operations / b.seconds);
  return sorted[Math.floor((sorted.length - 1) / 2)] as Measurement;
}

/** The `p`-th percentile (0–100) of `values`. */
export function percentile(values: readonly number[], p: number): number {
  if (values.length === 0) return Number.NaN;
  const sorted = [...values].sort((a, b) => a - b);
  const index = Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1);
  return sorted[Math.max(0, index)] as number;
}
