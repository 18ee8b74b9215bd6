/**
 * A worker process for the leases group: claims a lease through the adapter under test, says so
 * on stdout, and then hangs until it is killed.
 *
 * Usage: node lease-worker.mjs '<json>' with { module, url, schema, namespace, jobKey, ttlMs }.
 */
import { pathToFileURL } from 'node:url';
import { createLockClient } from '@lockkit/core';
import type { AdapterInstance } from './harness.js';

interface WorkerConfig {
  readonly module: string;
  readonly url: string;
  readonly schema: string;
  readonly namespace: string;
  readonly jobKey: string;
  readonly ttlMs: number;
}

async function main(): Promise<void> {
  const config = JSON.parse(process.argv[2] ?? '{}') as WorkerConfig;
  const adapter = (await import(pathToFileURL(config.module).href)) as {
    createInstance(options: { url: string; poolSize: number }): AdapterInstance<unknown, unknown>;
  };
  const instance = adapter.createInstance({ url: config.url, poolSize: 2 });
  const locks = createLockClient(instance.executor, { schema: config.schema });
  const result = await locks.runWithLease(
    config.namespace,
    config.jobKey,
    async (lease) => {
      process.stdout.write(`CLAIMED ${lease.token}\n`);
      await new Promise(() => {}); // work "forever": until the parent kills this process
    },
    { ttlMs: config.ttlMs },
  );
  process.stdout.write(
    `NOT CLAIMED ${JSON.stringify(result, (_k, v) => (typeof v === 'bigint' ? String(v) : v))}\n`,
  );
  await instance.close();
}

main().catch((error: unknown) => {
  process.stdout.write(`ERROR ${String(error)}\n`);
  process.exitCode = 1;
});
