import { lockkitTestConfig } from '@lockkit/test-db/vitest-config';

// The scheduler must not depend on the host's time zone (cron defaults to UTC): core's tests run
// in a zone with an odd offset and DST (+12:45/+13:45), inherited by the test workers.
process.env.TZ = 'Pacific/Chatham';

// LOCKKIT_TEST_UNIT=0: only the tests that talk to a server (test/), for a pass whose point is the
// server it is given (CI's DATABASE_URL pass); the server-free unit tests (src/) are left to
// another pass on the same Node, which runs them all.
const serverOnly = process.env.LOCKKIT_TEST_UNIT === '0';

export default lockkitTestConfig(serverOnly ? { include: ['test/**/*.test.ts'] } : {}, {
  pgbouncer: true,
});
