#!/usr/bin/env node
/**
 * The release dry run: pack every published package as `changeset publish` would publish it
 * (with scripts/tarballs.mjs, as `pnpm tarballs` does for users), install the tarballs into a new
 * project outside the workspace with npm, type-check the node-postgres example against the installed
 * types, and run the node-postgres example (ESM) and the postgres.js example (CommonJS) there.
 *
 *   DATABASE_URL=postgres://… node scripts/release-smoke.mjs   (after `pnpm build`)
 */
import { execFileSync } from 'node:child_process';
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, join, resolve } from 'node:path';
import { packPublished } from './tarballs.mjs';

const root = resolve(import.meta.dirname, '..');
if (!process.env.DATABASE_URL) {
  console.error('release-smoke: set DATABASE_URL (the examples run against it).');
  process.exit(2);
}

const run = (cmd, args, cwd) => {
  console.log(`$ ${cmd} ${args.join(' ')}`);
  execFileSync(cmd, args, {
    cwd,
    stdio: 'inherit',
    env: { ...process.env, npm_config_fund: 'false', npm_config_audit: 'false' },
  });
};

const work = mkdtempSync(join(tmpdir(), 'lockkit-release-smoke-'));
try {
  // The same tarballs `pnpm tarballs` gives a user before the first release.
  const tgz = [...packPublished(join(work, 'tarballs')).values()];
  console.log(`packed: ${tgz.map((f) => basename(f)).join(', ')}`);

  const project = join(work, 'project');
  mkdirSync(join(project, 'src'), { recursive: true });
  const versionOf = (example, name) =>
    JSON.parse(readFileSync(join(root, 'examples', example, 'package.json'), 'utf8'))
      .dependencies?.[name] ??
    JSON.parse(readFileSync(join(root, 'examples', example, 'package.json'), 'utf8'))
      .devDependencies[name];
  writeFileSync(
    join(project, 'package.json'),
    `${JSON.stringify({ name: 'lockkit-release-smoke', private: true, type: 'module' }, null, 2)}\n`,
  );
  run(
    'npm',
    [
      'install',
      '--no-package-lock',
      ...tgz,
      `pg@${versionOf('pg', 'pg')}`,
      `postgres@${versionOf('postgres', 'postgres')}`,
      `typescript@${versionOf('pg', 'typescript')}`,
      `@types/pg@${versionOf('pg', '@types/pg')}`,
      `@types/node@${versionOf('pg', '@types/node')}`,
    ],
    project,
  );

  // Types, as a user's project sees them from the registry: the pg example's source and tsconfig.
  copyFileSync(join(root, 'examples/pg/src/main.ts'), join(project, 'src/main.ts'));
  copyFileSync(join(root, 'examples/pg/tsconfig.json'), join(project, 'tsconfig.json'));
  run(join(project, 'node_modules/.bin/tsc'), ['-p', 'tsconfig.json'], project);
  run('node', ['dist/main.js'], project);

  // CommonJS: the postgres.js example compiled to `require` calls, resolved to the CJS builds.
  copyFileSync(join(root, 'examples/postgres/dist/main.js'), join(project, 'postgres-example.cjs'));
  run('node', ['postgres-example.cjs'], project);

  // The CLI's bin, installed from its tarball.
  run(join(project, 'node_modules/.bin/lockkit'), ['key', 'billing', 'nightly-report'], project);
  console.log(`release-smoke: ${tgz.length} tarballs installed; examples type-checked and run`);
} finally {
  rmSync(work, { recursive: true, force: true });
}
