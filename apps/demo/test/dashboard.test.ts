/**
 * The dashboard in a real browser: start the demo with its dashboard, open the page in headless
 * Chromium, and see a held lock (decoded to its job name) and completed runs appear. Saves a
 * screenshot to test-artifacts/dashboard.png.
 */
import { spawn } from 'node:child_process';
import { existsSync, mkdirSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { testDatabaseBaseUrl } from '@lockkit/test-db';
import { chromium } from 'playwright-core';
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

describe.skipIf(!available)(
  `the dashboard in headless Chromium${available ? '' : ' — skipped: /usr/bin/chromium is not installed (apt-get install chromium)'}`,
  () => {
    it('shows a held lock by job name and completed runs while the demo runs', async () => {
      const demo = spawn(
        process.execPath,
        [
          main,
          '--url',
          testDatabaseBaseUrl(),
          '--workers',
          '3',
          '--seconds',
          '25',
          '--dashboard',
          '0',
        ],
        {
          stdio: ['ignore', 'pipe', 'pipe'],
        },
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
        const browser = await chromium.launch({
          executablePath: CHROMIUM,
          args: [
            '--no-sandbox',
            '--disable-gpu',
            '--disable-background-networking',
            '--disable-component-update',
            '--no-first-run',
          ],
        });
        try {
          const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
          await page.goto(url);
          expect(await page.locator('h1').textContent()).toBe('lockkit dashboard');
          // A scheduled job's transaction lock, decoded from pg_locks to its name, held by a worker.
          const held = page
            .locator('#locks tr', { hasText: 'lockkit-scheduler/sweep-queue' })
            .filter({ hasText: 'held' });
          await held.first().waitFor({ timeout: 20_000 });
          // Completed runs in the ledger timeline.
          await page
            .locator('#jobs .tick[data-status="SUCCEEDED"]')
            .first()
            .waitFor({ timeout: 20_000 });
          const succeeded = await page.locator('#jobs .tick[data-status="SUCCEEDED"]').count();
          expect(succeeded).toBeGreaterThan(0);
          mkdirSync(artifacts, { recursive: true });
          await page.screenshot({ path: `${artifacts}dashboard.png`, fullPage: true });
          console.log(`[dashboard test] screenshot saved to ${artifacts}dashboard.png`);
        } finally {
          await browser.close();
        }
      } finally {
        demo.kill('SIGINT');
        await exited;
      }
    }, 90_000);
  },
);
