/**
 * Aligned text tables for humans (the CLI's `--json` output is for scripts).
 */

/** Renders rows as a table with a header line; every cell is stringified, columns padded. */
export function table(headers: readonly string[], rows: readonly (readonly unknown[])[]): string {
  const cells = rows.map((row) =>
    row.map((cell) => (cell === null || cell === undefined ? '-' : String(cell))),
  );
  const widths = headers.map((h, i) =>
    Math.max(h.length, ...cells.map((row) => (row[i] ?? '').length)),
  );
  const line = (values: readonly string[]) =>
    values
      .map((v, i) => v.padEnd(widths[i] ?? 0))
      .join('  ')
      .trimEnd();
  return [line(headers), line(widths.map((w) => '-'.repeat(w))), ...cells.map(line)].join('\n');
}

/** A duration in ms as `850ms`, `12.3s`, `4m10s`, or `-`. */
export function duration(ms: number | null): string {
  if (ms === null || !Number.isFinite(ms)) return '-';
  if (ms < 1000) return `${Math.round(ms)}ms`;
  if (ms < 60_000) return `${(ms / 1000).toFixed(1)}s`;
  return `${Math.floor(ms / 60_000)}m${Math.round((ms % 60_000) / 1000)}s`;
}

/** A date as ISO without milliseconds, or `-`. */
export function when(date: Date | null): string {
  return date ? date.toISOString().replace(/\.\d{3}Z$/, 'Z') : '-';
}

/**
 * `text` with the password of every `scheme://user:password@` in it replaced: whatever the user
 * typed may be echoed in a message (an unknown command, a bad value), a password never.
 *
 * A password typed raw may itself hold `@`, `:` or `/` (`postgres://u:p@ss@host/db`), and URL
 * parsers take the LAST `@` before the host as the end of the credentials. So everything from the
 * first `:` after the user up to the last `@` of the word is hidden: a word with an `@` further
 * on (in a query string) loses more than the password, never less.
 */
export function redactCredentials(text: string): string {
  return text.replace(/(\b[a-z][a-z0-9+.-]*:\/\/[^\s:/]*:)\S*@/gi, '$1***@');
}

/** A URL with any password replaced: URLs are echoed in messages, passwords never. */
export function redact(url: string): string {
  try {
    const parsed = new URL(url);
    if (parsed.password) parsed.password = '***';
    return parsed.toString();
  } catch {
    return '(unparsable URL)';
  }
}
