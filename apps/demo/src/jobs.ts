/**
 * The demo's jobs, registered identically by every worker.
 */

/** A job of the demo. */
export interface DemoJob {
  readonly name: string;
  readonly cron: string;
  readonly mode: 'transaction' | 'lease';
  /** Seconds between ticks. */
  readonly everySeconds: number;
  /** How long one run works, in ms. */
  readonly workMs: number;
}

export const JOBS: readonly DemoJob[] = [
  {
    name: 'generate-invoices',
    cron: '* * * * * *',
    mode: 'transaction',
    everySeconds: 1,
    workMs: 30,
  },
  { name: 'sweep-queue', cron: '*/2 * * * * *', mode: 'transaction', everySeconds: 2, workMs: 600 },
  { name: 'nightly-report', cron: '*/5 * * * * *', mode: 'lease', everySeconds: 5, workMs: 2500 },
];
