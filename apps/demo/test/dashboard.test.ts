/**
 * The dashboard in a real browser: start the demo with its dashboard and open it in headless
 * Chromium. Under a foreign name resolved to this machine (DNS rebinding) it is refused. A plain
 * page with no script at all — what a headless screenshot sees — already shows each job's recent
 * runs and who ran them, the locks held in the last seconds with their holders' application names,
 * and the leases with their holders; the live page then refreshes by itself. Saves the screenshot
 * to test-artifacts/dashboard.png.
 */
import { spawn } from 'node:child_process';
import { existsSync, mkdirSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { testDatabaseBaseUrl } from '@lockkit/test-db';
import { chromium, type Page } from 'playwright-core';
import { describe, expect, it } from 'vitest';

const CHROMIUM = '/usr/bin/chromium';
const available = existsSync(CHROMIUM);
if (!available && process.env.LOCKKIT_TEST_REQUIRE_CHROMIUM === '1') {
  throw new Error(
    `LOCKKIT_TEST_REQUIRE_CHROMIUM=1 but ${CHROMIUM} is missing (apt-get install chromium)`,
  );
}
const main = fileURLToPath(new URL('../dist/main.mjs', import.meta.url));
const artifacts = fileURLToPath(new URL('../test-artifacts/', import.meta.url));
const VIEWPORT = { width: 1280, height: 900 };

/** Reloads `url` until its first HTML satisfies `ready` (the demo needs a few seconds of runs). */
async function firstHtmlUntil(
  page: Page,
  url: string,
  ready: () => Promise<boolean>,
  timeoutMs: number,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    await page.goto(url);
    if (await ready()) return;
    if (Date.now() > deadline)
      throw new Error(`the page never showed it:\n${await page.content()}`);
    await new Promise((r) => setTimeout(r, 500));
  }
}

describe.skipIf(!available)(
  `the dashboard in headless Chromium${available ? '' : ' — skipped: /usr/bin/chromium is not installed (apt-get install chromium)'}`,
  () => {
    it('refuses a foreign Host, and shows recent runs, runners, recent locks and leases in a plain screenshot', async () => {
      const demo = spawn(
        process.execPath,
        [
          main,
          '--url',
          testDatabaseBaseUrl(),
          '--workers',
          '3',
          '--seconds',
          '40',
          '--dashboard',
          '0',
        ],
        { stdio: ['ignore', 'pipe', 'pipe'] },
      );
      const exited = new Promise((r) => demo.once('exit', r));
      try {
        const url = await new Promise<string>((resolve, reject) => {
          let out = '';
          const timer = setTimeout(() => reject(new Error(`no dashboard URL: ${out}`)), 30_000);
          demo.stdout.on('data', (chunk: Buffer) => {
            out += chunk.toString();
            const match = /dashboard: (http:\/\/\S+)/.exec(out);
            if (match) {
              clearTimeout(timer);
              resolve(match[1] as string);
            }
          });
        });
        const port = new URL(url).port;
        const browser = await chromium.launch({
          executablePath: CHROMIUM,
          args: [
            '--no-sandbox',
            '--disable-gpu',
            '--disable-background-networking',
            '--disable-component-update',
            '--no-first-run',
            // A rebinding attacker's name, resolving to this machine.
            '--host-resolver-rules=MAP attacker.example 127.0.0.1',
          ],
        });
        try {
          // DNS rebinding: the browser reaches the dashboard under a foreign name; it says no.
          const foreign = await browser.newPage();
          for (const path of ['/', '/api/state', '/events']) {
            const response = await foreign.goto(`http://attacker.example:${port}${path}`);
            expect(response?.status(), path).toBe(403);
            expect(await foreign.content()).not.toMatch(/capacity|lockkit-scheduler/);
          }
          await foreign.close();

          // A plain page, no script: what the server rendered is all there is.
          const plain = await browser.newContext({ javaScriptEnabled: false, viewport: VIEWPORT });
          const page = await plain.newPage();
          const runs = page.locator('#runs tr.run[data-status="SUCCEEDED"]');
          const sweep = page.locator('#locks tr', { hasText: 'lockkit-scheduler/sweep-queue' });
          const lease = page.locator('#leases tr', {
            hasText: 'lockkit-scheduler/nightly-report',
          });
          await firstHtmlUntil(
            page,
            url,
            async () =>
              (await runs.count()) > 0 && (await sweep.count()) > 0 && (await lease.count()) > 0,
            40_000,
          );
          // Recent runs with who ran them, as text.
          const ranBy = await runs.locator('td.owner').allTextContents();
          expect(ranBy.length).toBeGreaterThan(0);
          for (const owner of ranBy) expect(owner).toMatch(/^w[0-2]$/);
          // Each job's last runs, with their runners, in its row.
          expect(
            await page.locator('#jobs tr[data-job="generate-invoices"] .latest').textContent(),
          ).toMatch(/SUCCEEDED by w[0-2]/);
          // A lock held in the last seconds, with its holder's application name (not "-").
          expect(await sweep.first().textContent()).toMatch(/lockkit-demo-w[0-2]/);
          // The lease and its holder.
          expect(await lease.first().locator('td.holder').textContent()).toMatch(/^w[0-2]$/);
          mkdirSync(artifacts, { recursive: true });
          await page.screenshot({ path: `${artifacts}dashboard.png`, fullPage: true });
          console.log(`[dashboard test] screenshot saved to ${artifacts}dashboard.png`);
          await plain.close();

          // The live page refreshes itself over the event stream.
          const live = await browser.newPage({ viewport: VIEWPORT });
          await live.goto(url);
          const first = await live.locator('#status').textContent();
          await live
            .locator('#status')
            .filter({ hasNotText: first ?? '' })
            .waitFor({ timeout: 10_000 });
          expect(await live.locator('#runs tr.run').count()).toBeGreaterThan(0);
        } finally {
          await browser.close();
        }
      } finally {
        demo.kill('SIGINT');
        await exited;
      }
    }, 120_000);
  },
);
