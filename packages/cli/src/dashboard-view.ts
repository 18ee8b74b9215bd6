/**
 * The dashboard's content, rendered on the server from one snapshot: the first HTML a browser
 * gets already shows the data (a plain headless screenshot, or a page without script, sees it),
 * and the live page swaps in the same HTML as new snapshots arrive. Every value from the database
 * is escaped.
 */
import type { InspectedJob, InspectedRun } from '@lockkit/core';
import type { DashboardSnapshot } from './dashboard-feed.js';
import type { SeenLock } from './lock-history.js';

/** `value` as HTML text (`-` for nothing). */
export function escapeHtml(value: unknown): string {
  const text = value === null || value === undefined || value === '' ? '-' : String(value);
  return text.replace(
    /[&<>"']/g,
    (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c] as string,
  );
}

const clock = (at: number | Date | null | undefined): string =>
  at === null || at === undefined ? '-' : new Date(at).toISOString().slice(11, 19);

const ago = (now: number, at: number): string => {
  const s = Math.max(0, now - at) / 1000;
  return s < 1
    ? 'now'
    : s < 90
      ? `${s.toFixed(s < 10 ? 1 : 0)} s ago`
      : `${Math.round(s / 60)} min ago`;
};

/** A run's duration from the ledger; `-` when unknown (a transaction-mode run records both ends at its transaction's start). */
const took = (run: InspectedRun): string => {
  if (!run.startedAt || !run.finishedAt) return '-';
  const ms = run.finishedAt.getTime() - run.startedAt.getTime();
  if (ms <= 0) return '-';
  return ms < 1000 ? `${Math.round(ms)} ms` : `${(ms / 1000).toFixed(1)} s`;
};

const errorCell = (error: string | null): string =>
  error ? `<td class="error-text">${escapeHtml(error)}</td>` : '<td class="dim">-</td>';

const name = (names: { namespace: string; jobKey: string } | undefined, key: string): string =>
  names ? `${names.namespace}/${names.jobKey}` : key;

function table(
  id: string,
  headers: readonly string[],
  rows: readonly string[],
  empty: string,
): string {
  if (rows.length === 0) return `<p class="empty" id="${id}">${escapeHtml(empty)}</p>`;
  return `<table id="${id}"><thead><tr>${headers.map((h) => `<th>${escapeHtml(h)}</th>`).join('')}</tr></thead><tbody>${rows.join('')}</tbody></table>`;
}

const badge = (status: string): string =>
  `<span class="badge ${escapeHtml(status)}">${escapeHtml(status)}</span>`;

function holderText(h: SeenLock['holders'][number]): string {
  const app = h.applicationName ? escapeHtml(h.applicationName) : '<i>no application_name</i>';
  const where = h.clientAddress ? ` · ${escapeHtml(h.clientAddress)}` : '';
  return `<span class="holder${h.granted ? '' : ' waiter'}">${app} <span class="dim">pid ${escapeHtml(h.pid)}${where}${h.granted ? '' : ' · waiting'}</span></span>`;
}

function locksSection(s: DashboardSnapshot): string {
  const now = s.at;
  const blockedBy = new Map<number, readonly number[]>();
  for (const l of s.inspection.locks) if (!l.granted) blockedBy.set(l.pid, l.blockedBy);
  const rows = s.recentLocks.map((l) => {
    const state = l.heldNow
      ? `<span class="held">held</span>${l.waitingNow ? ' <span class="waiting">+ waiting</span>' : ''}`
      : l.waitingNow
        ? '<span class="waiting">waiting</span>'
        : '<span class="dim">released</span>';
    const waits = l.holders
      .filter((h) => !h.granted && blockedBy.has(h.pid))
      .map((h) => `pid ${h.pid} waits for ${(blockedBy.get(h.pid) ?? []).join(', ')}`);
    return `<tr data-key="${escapeHtml(l.key)}" data-held-now="${l.heldNow}"><td class="lock-name">${escapeHtml(name(l.names, l.key))}</td><td>${escapeHtml(l.mode)}</td><td>${state}${waits.length ? `<div class="dim">${escapeHtml(waits.join('; '))}</div>` : ''}</td><td>${l.holders.map(holderText).join('<br>')}</td><td>${escapeHtml(ago(now, l.lastSeen))}</td><td>${escapeHtml(`held in ${l.heldSamples} sample${l.heldSamples === 1 ? '' : 's'}${l.waitingSamples ? `, awaited in ${l.waitingSamples}` : ''}`)}</td></tr>`;
  });
  return `<section><h2>Advisory locks held in the last ${escapeHtml(s.historySeconds)} s</h2>
<p class="note">Sampled from <code>pg_locks</code> every ${escapeHtml(s.sampleMs)} ms: a transaction lock often lives for milliseconds, so the locks that came and went are kept here with who held them.</p>
${table('locks', ['lock', 'mode', 'now', 'held by (application · pid · client)', 'last seen', 'seen'], rows, `No advisory lock was held or awaited in the last ${s.historySeconds} s.`)}</section>`;
}

function leasesSection(s: DashboardSnapshot): string {
  const rows = s.inspection.leases.map(
    (l) =>
      `<tr data-lease="${escapeHtml(`${l.namespace}/${l.jobKey}`)}"><td>${escapeHtml(`${l.namespace}/${l.jobKey}`)}</td><td>${l.held ? '<span class="held">held</span>' : escapeHtml(l.status === 'IN_PROGRESS' ? 'expired' : 'free')}</td><td class="holder">${escapeHtml(l.owner)}</td><td>${badge(l.status)}</td><td>${escapeHtml(l.token)}</td><td>${escapeHtml(l.held ? clock(l.expiresAt) : '-')}</td><td>${escapeHtml(clock(l.finishedAt))}</td><td>${escapeHtml(l.attempts)}</td>${errorCell(l.lastError)}</tr>`,
  );
  return `<section><h2>Leases</h2>
${table('leases', ['lease', 'state', 'holder (last owner)', 'status', 'token', 'expires', 'finished', 'attempts', 'last error'], rows, 'No leases (or no lockkit tables in this schema yet).')}</section>`;
}

function lastRuns(job: InspectedJob): string {
  const ticks = [...job.recent]
    .reverse()
    .map(
      (r) =>
        `<span class="tick ${escapeHtml(r.status)}" data-status="${escapeHtml(r.status)}" title="${escapeHtml(`${clock(r.tick)} ${r.status} ${r.owner ?? ''}`)}"></span>`,
    )
    .join('');
  const latest = job.recent
    .slice(0, 4)
    .map(
      (r) =>
        `<span class="run-text">${escapeHtml(clock(r.tick))} ${badge(r.status)} ${r.owner ? `by <b>${escapeHtml(r.owner)}</b>` : '<span class="dim">nobody</span>'}</span>`,
    )
    .join(' ');
  return `<div class="timeline">${ticks}</div><div class="latest">${latest}</div>`;
}

function jobsSection(s: DashboardSnapshot): string {
  const window = s.inspection.jobs[0]?.window ?? 0;
  const rows = s.inspection.jobs.map(
    (j) =>
      `<tr data-job="${escapeHtml(j.job)}"><td class="job">${escapeHtml(j.job)}</td><td>${lastRuns(j)}</td><td>${escapeHtml(clock(j.lastSuccess))}</td><td>${escapeHtml(j.ran)}</td><td${j.failed ? ' class="bad"' : ''}>${escapeHtml(j.failed)}</td><td${j.missed ? ' class="warn"' : ''}>${escapeHtml(j.missed)}</td><td>${escapeHtml(j.skippedOverlap)}</td></tr>`,
  );
  return `<section><h2>Scheduled jobs</h2>
<div class="legend"><span><i class="SUCCEEDED"></i>succeeded</span><span><i class="FAILED"></i>failed</span><span><i class="RUNNING"></i>running</span><span><i class="SKIPPED_OVERLAP"></i>skipped (overlap)</span><span><i class="MISSED"></i>missed</span><span><i class="ABANDONED"></i>abandoned</span></div>
${table('jobs', ['job', 'last runs (oldest → newest) and who ran them', 'last success', `runs*`, 'failed*', 'missed*', 'overlap*'], rows, 'No scheduled runs yet.')}
${rows.length ? `<p class="note">* over each job's latest ${escapeHtml(window)} ledger rows; runs are ticks that ran (not missed or skipped).</p>` : ''}</section>`;
}

function runsSection(s: DashboardSnapshot): string {
  const rows = s.inspection.recentRuns.map(
    (r) =>
      `<tr class="run" data-status="${escapeHtml(r.status)}" data-job="${escapeHtml(r.job)}"><td>${escapeHtml(clock(r.tick))}</td><td>${escapeHtml(r.job)}</td><td>${badge(r.status)}</td><td class="owner">${escapeHtml(r.owner)}</td><td>${escapeHtml(r.attempt)}</td><td>${escapeHtml(took(r))}</td>${errorCell(r.error)}</tr>`,
  );
  return `<section><h2>Recent runs</h2>
${table('runs', ['tick', 'job', 'status', 'ran by', 'attempt', 'took', 'error'], rows, 'No scheduled runs yet.')}</section>`;
}

/** The status line: when, where, and how full the lock table is. */
function statusLine(s: DashboardSnapshot): string {
  const c = s.inspection.capacity;
  return `<div class="meta" id="status">updated ${escapeHtml(clock(s.at))} UTC · schema ${escapeHtml(s.schema)} · lock table ${escapeHtml(c.used)} / ${escapeHtml(c.slots)} slots (${escapeHtml((c.ratio * 100).toFixed(1))}%)${c.warning ? ' — <b class="bad">nearly full</b>' : ''}</div>${s.error ? `<div class="failure">The last read failed: ${escapeHtml(s.error)} — showing the previous snapshot.</div>` : ''}`;
}

/** The page's main content for one snapshot. */
export function renderMain(s: DashboardSnapshot): string {
  return [statusLine(s), locksSection(s), leasesSection(s), jobsSection(s), runsSection(s)].join(
    '\n',
  );
}

/** The page's main content before the first snapshot, or when the database cannot be read. */
export function renderLoading(error?: string): string {
  return error
    ? `<div class="meta" id="status">The database could not be read yet; this page fills in by itself once it can.</div><div class="failure">${escapeHtml(error)}</div>`
    : '<div class="meta" id="status">loading — the first look at the database is not in yet; this page fills in by itself.</div>';
}
