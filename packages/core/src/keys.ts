/**
 * Lock keys: turning job names into Postgres advisory-lock keys, and `pg_locks` rows back into keys.
 *
 * Postgres has two advisory-lock key spaces that never collide with each other: a pair of int4
 * (`pg_advisory_lock(int4, int4)`, shown in `pg_locks` with `objsubid = 2`) and one int8
 * (`pg_advisory_lock(int8)`, `objsubid = 1`). A {@link LockKey} is one value in either space.
 *
 * @packageDocumentation
 */
import * as nodeCrypto from 'node:crypto';
import { LockKeyError } from './errors.js';

/**
 * Longest namespace or job key accepted, in UTF-8 bytes. Names are hashed, so length costs
 * nothing in Postgres, but a multi-kilobyte "name" is almost always a bug (a serialised payload
 * passed by mistake); 1 KiB leaves ample room for any real identifier.
 */
export const MAX_KEY_NAME_BYTES = 1024;

const INT32_MIN = -(2 ** 31);
const INT32_MAX = 2 ** 31 - 1;
const UINT32_MAX = 2 ** 32 - 1;
const INT64_MIN = -(2n ** 63n);
const INT64_MAX = 2n ** 63n - 1n;

/** Where an advisory lock appears in `pg_locks` (the `database` column aside). */
export interface PgLocksCoordinates {
  /** `pg_locks.classid`: the first int4 as an unsigned oid, or the high 32 bits of the int8. */
  readonly classid: number;
  /** `pg_locks.objid`: the second int4 as an unsigned oid, or the low 32 bits of the int8. */
  readonly objid: number;
  /** `pg_locks.objsubid`: 2 for an int4 pair, 1 for an int8 key. */
  readonly objsubid: 1 | 2;
}

/** The shape of a `pg_locks` row that {@link LockKey.fromPgLocks} reads; oids may arrive as strings. */
export interface PgLocksRow {
  /** Must be `'advisory'` when present. */
  readonly locktype?: string | null;
  readonly classid: number | string | bigint | null;
  readonly objid: number | string | bigint | null;
  readonly objsubid: number | string | bigint | null;
}

function checkName(value: unknown, what: string): string {
  if (typeof value !== 'string') {
    throw new LockKeyError('KEY_NOT_STRING', `${what} must be a string, got ${describe(value)}.`);
  }
  if (value.length === 0) {
    throw new LockKeyError('KEY_EMPTY', `${what} must not be empty.`);
  }
  if (!value.isWellFormed()) {
    // A lone surrogate encodes as U+FFFD, so two different strings would share one lock.
    throw new LockKeyError('KEY_MALFORMED', `${what} contains a lone UTF-16 surrogate.`);
  }
  const bytes = Buffer.byteLength(value, 'utf8');
  if (bytes > MAX_KEY_NAME_BYTES) {
    throw new LockKeyError(
      'KEY_TOO_LONG',
      `${what} is ${bytes} UTF-8 bytes; the limit is ${MAX_KEY_NAME_BYTES}.`,
    );
  }
  return value;
}

function checkInt32(value: unknown, what: string): number {
  if (typeof value !== 'number') {
    throw new LockKeyError('KEY_NOT_INTEGER', `${what} must be a number, got ${describe(value)}.`);
  }
  if (!Number.isInteger(value)) {
    throw new LockKeyError('KEY_NOT_INTEGER', `${what} must be an integer, got ${value}.`);
  }
  if (value < INT32_MIN || value > INT32_MAX) {
    throw new LockKeyError('KEY_OUT_OF_RANGE', `${what} must fit in int4, got ${value}.`);
  }
  // Normalise -0 so that keys compare and print alike.
  return value === 0 ? 0 : value;
}

function checkInt64(value: unknown): bigint {
  if (typeof value !== 'bigint') {
    throw new LockKeyError(
      'KEY_NOT_INTEGER',
      `An int8 lock key must be a bigint, got ${describe(value)}.`,
    );
  }
  if (value < INT64_MIN || value > INT64_MAX) {
    throw new LockKeyError('KEY_OUT_OF_RANGE', `An int8 lock key must fit in int8, got ${value}.`);
  }
  return value;
}

function checkOid(value: unknown, what: string): number {
  let n: number;
  if (typeof value === 'number') n = value;
  else if (typeof value === 'bigint') n = Number(value);
  else if (typeof value === 'string' && /^\d+$/.test(value)) n = Number(value);
  else throw new LockKeyError('KEY_NOT_INTEGER', `${what} must be an oid, got ${describe(value)}.`);
  if (!Number.isInteger(n) || n < 0 || n > UINT32_MAX) {
    throw new LockKeyError('KEY_OUT_OF_RANGE', `${what} must be an unsigned 32-bit oid, got ${n}.`);
  }
  return n;
}

function describe(value: unknown): string {
  if (value === null) return 'null';
  if (typeof value === 'number' || typeof value === 'bigint') return `${typeof value} ${value}`;
  return typeof value;
}

/** `crypto.hash`, read off the module so that a Node without it (before 20.12) still loads this. */
const oneShotHash = (nodeCrypto as { hash?: typeof nodeCrypto.hash }).hash;

/** First 4 bytes of SHA-256 over the UTF-8 bytes, read as a big-endian signed int32. */
function hashName(name: string): number {
  return sha256(name).readInt32BE(0);
}

/**
 * SHA-256 of `text`'s UTF-8 bytes: Node's one-shot `crypto.hash` where there is one (Node 20.12
 * on), which makes no `Hash` object, else a `Hash`. A scheduler hashes each job's name as it is
 * registered: 10,000 of them.
 */
export function sha256(text: string): Buffer {
  return oneShotHash !== undefined
    ? oneShotHash('sha256', text, 'buffer')
    : nodeCrypto.createHash('sha256').update(text, 'utf8').digest();
}

/**
 * The last namespace hashed and its hash: the keys of one scheduler's or client's jobs share one
 * namespace, and hashing it again for each of 10,000 jobs cost as many digests (and the memory
 * their churn leaves behind).
 */
let lastNamespace: { readonly name: string; readonly hash: number } | undefined;

function hashNamespace(name: string): number {
  if (lastNamespace?.name !== name) lastNamespace = { name, hash: hashName(name) };
  return lastNamespace.hash;
}

/**
 * The seed scheme: `[key1, key2]` for `pg_try_advisory_xact_lock(key1, key2)`, where each key is
 * the first 4 bytes of the SHA-256 digest of the UTF-8 bytes of the name, big-endian, signed.
 *
 * This is a compatibility contract: every implementation of the scheme (other languages, older
 * versions) derives the same pair, so they exclude each other on the same job.
 *
 * Collision odds: `key1` is shared by every job of one namespace, so jobs are told apart by 32
 * bits only. Two distinct job keys in one namespace collide with probability ≈ n²/2³³ for n keys:
 * about 1% at 9,300 keys and 50% at 77,000. A collision never breaks mutual exclusion; it makes
 * two unrelated jobs exclude each other. For large key sets (one lock per user, per row) use an
 * int8 key ({@link LockKey.fromBigInt}), e.g. the row's own bigint id.
 *
 * @throws {@link LockKeyError} for a name that is not a non-empty, well-formed string of at most
 * {@link MAX_KEY_NAME_BYTES} UTF-8 bytes.
 *
 * @example
 * ```ts
 * generateLockKeys('cron_jobs', 'generate_invoices'); // [-266172150, 1646866057]
 * ```
 */
export function generateLockKeys(namespace: string, jobKey: string): [number, number] {
  return [hashNamespace(checkName(namespace, 'namespace')), hashName(checkName(jobKey, 'jobKey'))];
}

/**
 * One Postgres advisory-lock key, validated on construction.
 *
 * - {@link LockKey.fromNames}: the seed scheme over (namespace, job key); the names are kept for display.
 * - {@link LockKey.fromPair}: a raw int4 pair.
 * - {@link LockKey.fromBigInt}: one int8, a different key space from every pair.
 * - {@link LockKey.fromPgLocks}: the reverse mapping from a `pg_locks` row.
 *
 * Instances are immutable; two keys are the same lock exactly when {@link LockKey.equals} says so.
 *
 * @example
 * ```ts
 * const key = LockKey.fromNames('cron_jobs', 'generate_invoices');
 * key.pgLocks; // { classid: 4028795146, objid: 1646866057, objsubid: 2 }
 * LockKey.fromPgLocks(key.pgLocks).equals(key); // true
 * ```
 */
export class LockKey {
  /** `'pair'` for two int4 (`objsubid` 2), `'int8'` for one bigint (`objsubid` 1). */
  readonly kind: 'pair' | 'int8';
  /** For a pair key: the two int4 values. For an int8 key: `undefined`. */
  readonly pair: readonly [number, number] | undefined;
  /** For an int8 key: its value. For a pair key: `undefined`. */
  readonly int8: bigint | undefined;
  /** The names a key built by {@link LockKey.fromNames} came from, for display; else `undefined`. */
  readonly names: { readonly namespace: string; readonly jobKey: string } | undefined;

  private constructor(
    pair: readonly [number, number] | undefined,
    int8: bigint | undefined,
    names: { readonly namespace: string; readonly jobKey: string } | undefined,
  ) {
    this.kind = pair ? 'pair' : 'int8';
    this.pair = pair ? Object.freeze([pair[0], pair[1]] as const) : undefined;
    this.int8 = int8;
    // A literal, not a spread: V8 gave each spread copy a hidden class of its own (~200 bytes a key).
    this.names = names
      ? Object.freeze({ namespace: names.namespace, jobKey: names.jobKey })
      : undefined;
    Object.freeze(this);
  }

  /**
   * The key of `(namespace, jobKey)` under the seed scheme ({@link generateLockKeys}).
   * @throws {@link LockKeyError} for an unusable name.
   */
  static fromNames(namespace: string, jobKey: string): LockKey {
    const pair = generateLockKeys(namespace, jobKey);
    return new LockKey(pair, undefined, { namespace, jobKey });
  }

  /**
   * A raw int4 pair, as passed to `pg_advisory_lock(int4, int4)`.
   * @throws {@link LockKeyError} when either value is not an integer in int4 range.
   */
  static fromPair(key1: number, key2: number): LockKey {
    return new LockKey([checkInt32(key1, 'key1'), checkInt32(key2, 'key2')], undefined, undefined);
  }

  /**
   * One int8 key, as passed to `pg_advisory_lock(int8)`. Never equal to any pair key.
   * @throws {@link LockKeyError} when the value is not a bigint in int8 range.
   */
  static fromBigInt(key: bigint): LockKey {
    return new LockKey(undefined, checkInt64(key), undefined);
  }

  /**
   * The key an advisory-lock row of `pg_locks` stands for. Accepts oids as numbers, numeric
   * strings or bigints, as drivers return them.
   * @throws {@link LockKeyError} for a row that is not an advisory lock or has impossible values.
   */
  static fromPgLocks(row: PgLocksRow): LockKey {
    if (row.locktype != null && row.locktype !== 'advisory') {
      throw new LockKeyError(
        'KEY_NOT_ADVISORY',
        `pg_locks row has locktype ${row.locktype}, not advisory.`,
      );
    }
    const classid = checkOid(row.classid, 'classid');
    const objid = checkOid(row.objid, 'objid');
    const objsubid = checkOid(row.objsubid, 'objsubid');
    if (objsubid === 2) {
      return new LockKey([classid | 0, objid | 0], undefined, undefined);
    }
    if (objsubid === 1) {
      const value = BigInt.asIntN(64, (BigInt(classid) << 32n) | BigInt(objid));
      return new LockKey(undefined, value, undefined);
    }
    throw new LockKeyError(
      'KEY_NOT_ADVISORY',
      `objsubid ${objsubid} is neither 1 (int8) nor 2 (int4 pair).`,
    );
  }

  /** Where this lock shows up in `pg_locks`. */
  get pgLocks(): PgLocksCoordinates {
    if (this.pair) {
      return { classid: this.pair[0] >>> 0, objid: this.pair[1] >>> 0, objsubid: 2 };
    }
    const value = BigInt.asUintN(64, this.int8 as bigint);
    return {
      classid: Number(value >> 32n),
      objid: Number(value & 0xffffffffn),
      objsubid: 1,
    };
  }

  /** True when both keys name the same Postgres advisory lock (names are not compared). */
  equals(other: LockKey): boolean {
    if (this.pair && other.pair) {
      return this.pair[0] === other.pair[0] && this.pair[1] === other.pair[1];
    }
    return this.int8 !== undefined && this.int8 === other.int8;
  }

  /** `cron_jobs/generate_invoices (-266172150,1646866057)`, `(-266172150,1646866057)` or `int8 42`. */
  toString(): string {
    if (this.pair) {
      const raw = `(${this.pair[0]},${this.pair[1]})`;
      return this.names ? `${this.names.namespace}/${this.names.jobKey} ${raw}` : raw;
    }
    return `int8 ${this.int8}`;
  }
}
