import { lockkitTestConfig } from './src/vitest-config.js';
export default lockkitTestConfig();
