/**
 * The per-test fixture: a fresh adapter instance under a fresh `application_name`, and the
 * after-each checks that fail a test which leaks a lock or a pooled connection.
 */
import { randomBytes } from 'node:crypto';
import { createLockClient, type LockClient } from '@lockkit/core';
import { afterAll, afterEach, beforeAll, beforeEach, expect, it } from 'vitest';
import {
  type AdapterInstance,
  type ConformanceAdapter,
  type ConformanceCaseId,
  Observer,
  taggedUrl,
} from './harness.js';

declare module 'vitest' {
  interface TaskMeta {
    /** Set on a case run as `it.fails` (a known defect): the test report counts it apart. */
    expectedFailure?: boolean;
  }
}

/** What a case gets: instances, lock clients and the observer, all fresh for each test. */
export interface Fixture<Tx, Session> {
  readonly adapter: ConformanceAdapter<Tx, Session>;
  /** This test's `application_name`: every instance of the test connects under it. */
  readonly applicationName: string;
  /** The database URL tagged with {@link Fixture.applicationName}. */
  readonly url: string;
  readonly observer: Observer;
  /** The test's default instance (pool of 10). */
  readonly instance: AdapterInstance<Tx, Session>;
  /** A lock client over {@link Fixture.instance}. */
  readonly locks: LockClient<Tx, Session>;
  /** Another instance for this test, closed and leak-checked with it. */
  newInstance(
    poolSize: number,
    url?: string,
    transactionPooler?: boolean,
  ): AdapterInstance<Tx, Session>;
}

/** How long the checks after each case wait for the case's pools to close. */
const CLOSE_WATCHDOG_MS = 15_000;

/** Declares the fixture hooks in the current describe block and returns its accessor. */
export function useFixture<Tx, Session>(
  adapter: ConformanceAdapter<Tx, Session>,
): () => Fixture<Tx, Session> {
  let observer: Observer | undefined;
  let current: Fixture<Tx, Session> | undefined;
  let instances: AdapterInstance<Tx, Session>[] = [];

  beforeAll(async () => {
    observer = await Observer.connect(adapter.observerUrl?.() ?? adapter.databaseUrl());
  });
  afterAll(async () => {
    await observer?.close();
  });

  beforeEach(() => {
    const applicationName = `lockkit-conf-${randomBytes(6).toString('hex')}`;
    const url = taggedUrl(adapter.databaseUrl(), applicationName);
    instances = [];
    const newInstance = (poolSize: number, at = url, transactionPooler?: boolean) => {
      const created = adapter.createInstance({
        url: at,
        poolSize,
        ...(transactionPooler !== undefined && { transactionPooler }),
      });
      instances.push(created);
      return created;
    };
    const instance = newInstance(10);
    current = {
      adapter,
      applicationName,
      url,
      observer: observer as Observer,
      instance,
      locks: createLockClient(instance.executor),
      newInstance,
    };
  });

  afterEach(async () => {
    const fixture = current as Fixture<Tx, Session>;
    const checkedOut = async (): Promise<number> => {
      let n = 0;
      for (const i of instances) n += (await i.checkedOut?.()) ?? 0;
      return n;
    };
    // What a read finds once it is clean, or still finds after `ms`: read at once, and again
    // until clean only when it was not.
    const settled = async <T>(
      read: () => Promise<T>,
      clean: (value: T) => boolean,
      ms: number,
    ): Promise<T> => {
      let value = await read();
      if (!clean(value)) {
        await fixture.observer.until(async () => {
          value = await read();
          return clean(value);
        }, ms);
      }
      return value;
    };
    // A connection the driver hands back a moment after the call settled (Prisma releases after
    // its own bookkeeping; a liveness probe may be in flight) is not a leak; one still out after
    // two seconds is.
    const leakedConnections = await settled(checkedOut, (n) => n === 0, 2000);
    // Postgres frees a terminated backend's locks a moment after the client notices.
    const locks = await settled(
      () => fixture.observer.locksOf(fixture.applicationName),
      (held) => held.length === 0,
      1000,
    );
    // A call its caller left while it waited for a connection still gets that connection later
    // (drivers cannot withdraw the ask: see core's abandonable-checkout.ts); postgres.js then
    // sends BEGIN before lockkit's callback gives it back with a ROLLBACK, and on a busy machine
    // the snapshot can fall between the two. One still in a transaction after two seconds is a leak.
    const busy = await settled(
      () => fixture.observer.busyConnectionsOf(fixture.applicationName),
      (found) => found.length === 0,
      2000,
    );
    // Bounded: a driver a fault left wedged must fail this check by name, not the hook's timeout.
    let timer: ReturnType<typeof setTimeout> | undefined;
    const closed = await Promise.race([
      Promise.all(instances.map((i) => i.close())).then(() => true),
      new Promise<false>((resolve) => {
        timer = setTimeout(() => resolve(false), CLOSE_WATCHDOG_MS);
      }),
    ]);
    clearTimeout(timer);
    expect(closed, `the test's pools closed within ${CLOSE_WATCHDOG_MS} ms`).toBe(true);
    expect(
      locks.map((l) => `${l.key} ${l.mode} granted=${l.granted}`),
      'leaked advisory locks',
    ).toEqual([]);
    expect(leakedConnections, 'connections still checked out of the pool').toBe(0);
    expect(busy, 'connections left inside a transaction').toEqual([]);
  });

  return () => current as Fixture<Tx, Session>;
}

/**
 * `it`; or a visible skip carrying the adapter's reason when the case is disabled; or `it.fails`
 * naming the known defect when the adapter lists the case as an expected failure.
 */
export function caseIt<Tx, Session>(
  adapter: ConformanceAdapter<Tx, Session>,
  id: ConformanceCaseId,
  title: string,
  fn: () => Promise<void>,
  timeout?: number,
): void {
  const reason = adapter.disable?.[id];
  const defect = adapter.expectedFailures?.[id];
  if (reason !== undefined) {
    it.skip(`${id}: ${title} — disabled by the adapter: ${reason}`, fn);
  } else if (defect !== undefined) {
    it.fails(
      `${id}: ${title} — EXPECTED TO FAIL, known defect: ${defect}`,
      (context) => {
        // Read by the test report, which counts these apart from the cases that pass.
        context.task.meta.expectedFailure = true;
        return fn();
      },
      timeout,
    );
  } else {
    it(`${id}: ${title}`, fn, timeout);
  }
}

/** {@link caseIt} bound to one adapter: how every group declares its cases. */
export function casesOf<Tx, Session>(
  adapter: ConformanceAdapter<Tx, Session>,
): (id: ConformanceCaseId, title: string, fn: () => Promise<void>, timeout?: number) => void {
  return (id, title, fn, timeout) => caseIt(adapter, id, title, fn, timeout);
}

/**
 * Runs `fn` with a fresh random schema holding lockkit's tables (plus `extraTables`), and a lock
 * client on it over the test's instance; drops the schema afterwards, whatever happens.
 */
export async function withLockkitSchema<Tx, Session>(
  f: Fixture<Tx, Session>,
  fn: (schema: string, locks: LockClient<Tx, Session>) => Promise<void>,
  extraTables: readonly string[] = [],
): Promise<void> {
  const schema = `lockkit_conf_${randomBytes(6).toString('hex')}`;
  const locks = createLockClient(f.instance.executor, { schema });
  try {
    await locks.migrate();
    for (const table of extraTables) await f.observer.query(`CREATE TABLE "${schema}".${table}`);
    await fn(schema, locks);
  } finally {
    await f.observer.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
  }
}
