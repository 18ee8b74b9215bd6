/**
 * The dashboard's single page: plain HTML and CSS around content the server renders
 * (dashboard-view.ts), and a few lines of script that swap in each new rendering pushed over the
 * server's event stream. The script runs under a per-response nonce (Content-Security-Policy).
 */

const STYLE = `
  body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #1d2330; background: #f7f8fa; }
  h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 15px; margin: 24px 0 6px; }
  .meta, .note, .dim { color: #667; font-size: 12px; } .note { margin: 0 0 6px; }
  .failure { color: #a1262f; font-weight: 600; margin-top: 6px; }
  table { border-collapse: collapse; background: #fff; box-shadow: 0 1px 2px #0001; }
  th, td { padding: 4px 10px; text-align: left; vertical-align: top; border-bottom: 1px solid #eef; font-variant-numeric: tabular-nums; }
  th { background: #eef1f6; font-weight: 600; font-size: 12px; }
  .held { color: #0a7d33; font-weight: 600; } .waiting { color: #b35c00; font-weight: 600; }
  .bad { color: #a1262f; font-weight: 600; } .warn { color: #b35c00; }
  .empty { color: #889; font-style: italic; }
  .error-text { color: #a1262f; max-width: 320px; overflow-wrap: anywhere; }
  .timeline { display: flex; gap: 2px; flex-wrap: wrap; max-width: 420px; margin-bottom: 3px; }
  .tick { display: inline-block; width: 12px; height: 16px; border-radius: 2px; }
  .latest { font-size: 12px; } .run-text { white-space: nowrap; margin-right: 8px; }
  .badge { font-size: 11px; padding: 0 4px; border-radius: 3px; color: #fff; }
  .SUCCEEDED, .COMPLETED { background: #2ea44f; } .FAILED { background: #d73a49; } .MISSED { background: #9aa1ad; }
  .SKIPPED_OVERLAP { background: #e8a33d; } .RUNNING, .IN_PROGRESS { background: #3b82f6; } .ABANDONED { background: #8b5cf6; }
  .legend span { display: inline-block; margin-right: 12px; font-size: 12px; }
  .legend i { display: inline-block; width: 10px; height: 10px; margin-right: 4px; border-radius: 2px; vertical-align: -1px; }
`;

/**
 * The whole page around `main` (already-escaped HTML from dashboard-view.ts); `nonce` allows its
 * one script.
 */
export function renderPage(main: string, nonce: string): string {
  return `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>lockkit dashboard</title>
<style>${STYLE}</style>
</head>
<body>
<h1>lockkit dashboard</h1>
<main id="main">
${main}
</main>
<script nonce="${nonce}">
const main = document.getElementById('main');
const source = new EventSource('events' + location.search);
source.onmessage = (m) => { main.innerHTML = JSON.parse(m.data).html; };
source.onerror = () => {
  const status = document.getElementById('status');
  if (status) status.textContent = 'disconnected — retrying…';
};
</script>
</body>
</html>`;
}
