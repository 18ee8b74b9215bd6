/**
 * Reads the JSON-lines protocol the demo's and the chaos run's worker processes speak on stdout:
 * one JSON object per line; anything else (a stray log line) is ignored.
 */
import type { Readable } from 'node:stream';

/** Calls `onMessage` with each JSON object `stream` writes, one per line. */
export function onJsonLines<M>(stream: Readable | null, onMessage: (message: M) => void): void {
  let buffered = '';
  stream?.on('data', (chunk: Buffer) => {
    buffered += chunk.toString();
    const lines = buffered.split('\n');
    buffered = lines.pop() ?? '';
    for (const line of lines) {
      let message: M;
      try {
        message = JSON.parse(line) as M;
      } catch {
        continue;
      }
      onMessage(message);
    }
  });
}
