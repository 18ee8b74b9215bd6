/**
 * The dashboard's single page: plain HTML, CSS and a little script that listens to the server's
 * event stream and redraws locks, leases and the runs ledger.
 */
export const DASHBOARD_PAGE = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>lockkit dashboard</title>
<style>
  body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #1d2330; background: #f7f8fa; }
  h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 15px; margin: 24px 0 8px; }
  .meta { color: #667; font-size: 12px; }
  table { border-collapse: collapse; background: #fff; box-shadow: 0 1px 2px #0001; }
  th, td { padding: 4px 10px; text-align: left; border-bottom: 1px solid #eef; font-variant-numeric: tabular-nums; }
  th { background: #eef1f6; font-weight: 600; font-size: 12px; }
  .held { color: #0a7d33; font-weight: 600; } .waiting { color: #b35c00; font-weight: 600; }
  .empty { color: #889; font-style: italic; }
  .timeline { display: flex; gap: 2px; flex-wrap: wrap; max-width: 900px; }
  .tick { width: 12px; height: 18px; border-radius: 2px; }
  .SUCCEEDED { background: #2ea44f; } .FAILED { background: #d73a49; } .MISSED { background: #9aa1ad; }
  .SKIPPED_OVERLAP { background: #e8a33d; } .RUNNING { background: #3b82f6; } .ABANDONED { background: #8b5cf6; }
  .legend span { display: inline-block; margin-right: 12px; font-size: 12px; }
  .legend i { display: inline-block; width: 10px; height: 10px; margin-right: 4px; border-radius: 2px; vertical-align: -1px; }
</style>
</head>
<body>
<h1>lockkit dashboard</h1>
<div class="meta" id="status">connecting…</div>
<h2>Advisory locks</h2>
<div id="locks"></div>
<h2>Leases</h2>
<div id="leases"></div>
<h2>Scheduled jobs</h2>
<div class="legend"><span><i class="SUCCEEDED"></i>succeeded</span><span><i class="FAILED"></i>failed</span><span><i class="RUNNING"></i>running</span><span><i class="SKIPPED_OVERLAP"></i>skipped (overlap)</span><span><i class="MISSED"></i>missed</span><span><i class="ABANDONED"></i>abandoned</span></div>
<div id="jobs"></div>
<script>
const esc = (v) => String(v ?? '-').replace(/[&<>"]/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;' })[c]);
const ms = (v) => (v == null ? '-' : v < 1000 ? Math.round(v) + 'ms' : (v / 1000).toFixed(1) + 's');
const time = (v) => (v ? new Date(v).toISOString().slice(11, 19) : '-');
function tableOf(headers, rows, empty) {
  if (!rows.length) return '<div class="empty">' + esc(empty) + '</div>';
  return '<table><tr>' + headers.map((h) => '<th>' + esc(h) + '</th>').join('') + '</tr>' +
    rows.map((r) => '<tr>' + r.map((c) => '<td>' + c + '</td>').join('') + '</tr>').join('') + '</table>';
}
function render(s) {
  const c = s.capacity;
  document.getElementById('status').textContent = 'updated ' + new Date().toLocaleTimeString() +
    ' · lock table ' + c.used + ' / ' + c.slots + ' slots (' + (c.ratio * 100).toFixed(1) + '%)' + (c.warning ? ' — nearly full' : '');
  document.getElementById('locks').innerHTML = tableOf(
    ['name', 'mode', 'status', 'pid', 'blocked by', 'application', 'transaction age', 'waiting'],
    s.locks.map((l) => [
      '<span class="lock-name">' + esc(l.names ? l.names.namespace + '/' + l.names.jobKey : l.key) + '</span>',
      esc(l.mode),
      l.granted ? '<span class="held">held</span>' : '<span class="waiting">waiting</span>',
      esc(l.pid), esc(l.blockedBy.join(', ') || '-'), esc(l.applicationName || '-'), ms(l.transactionAgeMs), ms(l.waitingMs),
    ]),
    'No advisory locks are held or awaited.',
  );
  document.getElementById('leases').innerHTML = tableOf(
    ['lease', 'token', 'status', 'held', 'owner', 'expires', 'attempts', 'last error'],
    s.leases.map((l) => [esc(l.namespace + '/' + l.jobKey), esc(l.token), esc(l.status), l.held ? '<span class="held">yes</span>' : 'no', esc(l.owner), time(l.expiresAt), esc(l.attempts), esc(l.lastError)]),
    'No leases.',
  );
  const byJob = {};
  for (const r of s.recentRuns) (byJob[r.job] = byJob[r.job] || []).push(r);
  document.getElementById('jobs').innerHTML = tableOf(
    ['job', 'last success', 'failed', 'missed', 'runs (oldest → newest)'],
    s.jobs.map((j) => [
      esc(j.job), time(j.lastSuccess), esc(j.failed), esc(j.missed),
      '<div class="timeline">' + (byJob[j.job] || []).slice().reverse().map((r) =>
        '<div class="tick ' + esc(r.status) + '" data-status="' + esc(r.status) + '" title="' + esc(time(r.tick) + ' ' + r.status + ' (' + (r.owner || '') + ')') + '"></div>').join('') + '</div>',
    ]),
    'No scheduled runs yet.',
  );
}
const source = new EventSource('events' + location.search);
source.onmessage = (m) => render(JSON.parse(m.data));
source.onerror = () => { document.getElementById('status').textContent = 'disconnected — retrying…'; };
</script>
</body>
</html>`;
