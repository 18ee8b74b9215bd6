/**
 * The Nest application the multi-process test starts several times: two per-second
 * `@ExclusiveCron` jobs, each writing one row per run into `<schema>.effects` (no unique
 * constraint, so a duplicate run would show), with its scheduler clock skewed by `skewMs`. It
 * imports `@lockkit/nestjs` by name — the built package, as an application would — and closes
 * through Nest's shutdown hooks on SIGTERM.
 *
 * Usage (after the test has compiled it): node tick-app.mjs '{"url","schema","worker","skewMs"}'
 */
import 'reflect-metadata';
import type { TransactionRun } from '@lockkit/core';
import { ExclusiveCron, LockkitScheduleModule } from '@lockkit/nestjs';
import { createLockKit } from '@lockkit/pg';
import { Injectable, Module, type OnApplicationShutdown } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import pg from 'pg';

interface AppConfig {
  readonly url: string;
  readonly schema: string;
  readonly worker: string;
  readonly skewMs: number;
}

const config = JSON.parse(process.argv[2] ?? '{}') as AppConfig;
const pool = new pg.Pool({ connectionString: config.url, max: 4 });
pool.on('error', () => {});

/** One row per run: the side effect the test counts. */
async function record(run: TransactionRun<pg.PoolClient>, job: string): Promise<void> {
  // A little work inside the tick's transaction, so that two runs of one tick would overlap.
  await new Promise((resolve) => setTimeout(resolve, Math.floor(Math.random() * 40)));
  await run.tx.query(
    `INSERT INTO "${config.schema}".effects (job, tick, worker) VALUES ($1, $2, $3)`,
    [job, run.tick, config.worker],
  );
}

@Injectable()
class Invoices {
  @ExclusiveCron('* * * * * *', { name: 'invoices' })
  issue(run: TransactionRun<pg.PoolClient>) {
    return record(run, 'invoices');
  }
}

@Injectable()
class Reports {
  @ExclusiveCron('* * * * * *', { name: 'reports', timezone: 'Europe/Oslo' })
  build(run: TransactionRun<pg.PoolClient>) {
    return record(run, 'reports');
  }
}

/**
 * Ends the pool after the scheduler has stopped (Nest calls this hook last), and says so: Nest
 * then re-raises the signal, so the process ends by SIGTERM either way.
 */
@Injectable()
class PoolCloser implements OnApplicationShutdown {
  async onApplicationShutdown(signal?: string) {
    await pool.end();
    process.stdout.write(`CLOSED ${signal ?? ''}\n`);
  }
}

@Module({
  imports: [
    LockkitScheduleModule.forRoot({
      lockKit: createLockKit(pool, { schema: config.schema }),
      scheduler: {
        owner: config.worker,
        now: () => Date.now() + config.skewMs,
        catchUpGraceMs: 3000,
      },
    }),
  ],
  providers: [Invoices, Reports, PoolCloser],
})
class AppModule {}

async function main(): Promise<void> {
  const app = await NestFactory.createApplicationContext(AppModule, {
    logger: ['error', 'warn'],
  });
  app.enableShutdownHooks();
  await app.init();
  process.stdout.write('READY\n');
}

main().catch((error: unknown) => {
  process.stdout.write(`ERROR ${String(error)}\n`);
  process.exitCode = 1;
});
