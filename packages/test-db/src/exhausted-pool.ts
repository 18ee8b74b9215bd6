/**
 * A lock call made while the pool's only connection is held by another call of the same client:
 * the driver's pool cannot lend one, and gives up after its own acquire timeout. Each adapter's
 * test sets that timeout on its driver; this runs the scenario and reports what came back.
 */
import pg from 'pg';

/** The lock client's calls that this scenario makes (any lockkit `LockClient` fits). */
export interface ExhaustibleLocks<K> {
  withLock(key: K, task: () => Promise<unknown>): Promise<unknown>;
  withSessionLock(key: K, task: () => Promise<unknown>): Promise<unknown>;
}

/** What the refused call and the holding call settled with. */
export interface ExhaustedPoolOutcome {
  /** What the refused call rejected with; undefined if it resolved. */
  readonly refused: unknown;
  /** Whether the refused call's task ran. */
  readonly ran: boolean;
  /** What the call holding the connection resolved with once let go. */
  readonly holder: unknown;
}

/**
 * Holds the pool's only connection in a `withLock` on `heldKey` until `call` on `refusedKey` has
 * settled, then lets the holder finish. No timing of its own: the refusal comes from the driver's
 * acquire timeout.
 */
export async function callOnExhaustedPool<K>(
  locks: ExhaustibleLocks<K>,
  call: 'withLock' | 'withSessionLock',
  heldKey: K,
  refusedKey: K,
): Promise<ExhaustedPoolOutcome> {
  let release!: () => void;
  const gate = new Promise<void>((resolve) => {
    release = resolve;
  });
  let holding!: () => void;
  const held = new Promise<void>((resolve) => {
    holding = resolve;
  });
  const holder = locks.withLock(heldKey, async () => {
    holding();
    await gate;
    return 'held';
  });
  await held;
  let ran = false;
  const refused = await locks[call](refusedKey, async () => {
    ran = true;
  }).then(
    () => undefined,
    (error: unknown) => error,
  );
  release();
  return { refused, ran, holder: await holder };
}

/** Advisory locks anyone holds on the key at these `pg_locks` coordinates, asked on a new connection. */
export async function advisoryHolders(
  url: string,
  at: { readonly classid: number; readonly objid: number },
): Promise<number> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    const { rows } = await client.query<{ n: number }>(
      `SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory'
         AND classid = $1::int8::oid AND objid = $2::int8::oid`,
      [at.classid, at.objid],
    );
    return rows[0]?.n ?? 0;
  } finally {
    await client.end();
  }
}
