import { lockkitTestConfig } from '@lockkit/test-db/vitest-config';

// The scheduler must not depend on the host's time zone (cron defaults to UTC): core's tests run
// in a zone with an odd offset and DST (+12:45/+13:45), inherited by the test workers.
process.env.TZ = 'Pacific/Chatham';

export default lockkitTestConfig({}, { pgbouncer: true });
