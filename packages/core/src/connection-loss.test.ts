/**
 * What counts as a lost connection: the server's and the socket's codes, never an error of the
 * task's own that merely carries an `E…` code (a file not found is not a dead connection).
 */
import { describe, expect, it } from 'vitest';
import { isConnectionLoss } from './connection-loss.js';

const withCode = (code: string) => Object.assign(new Error(`failed: ${code}`), { code });

describe('isConnectionLoss', () => {
  it('knows the socket codes of a connection that broke or never came', () => {
    for (const code of ['ECONNRESET', 'ECONNREFUSED', 'EPIPE', 'ETIMEDOUT', 'EHOSTUNREACH'])
      expect(isConnectionLoss(withCode(code)), code).toBe(true);
  });

  it('knows the server closing the connection (57P01) and the 08 class', () => {
    expect(isConnectionLoss(withCode('57P01'))).toBe(true);
    expect(isConnectionLoss(withCode('08006'))).toBe(true);
  });

  it('does not take a file-system or permission error for a lost connection', () => {
    for (const code of ['ENOENT', 'EACCES', 'EEXIST', 'EISDIR', 'EMFILE'])
      expect(isConnectionLoss(withCode(code)), code).toBe(false);
  });
});
