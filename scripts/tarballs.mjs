#!/usr/bin/env node
/**
 * `pnpm tarballs`: how to install lockkit before its first npm release. Builds every published
 * package, packs each into `tarballs/` exactly as `changeset publish` would publish it (`pnpm pack`
 * turns `workspace:` ranges into versions), and prints for each package the `npm i` line that
 * installs it in another project: its tarball, the tarballs of the @lockkit packages it depends
 * on (they are not on npm either), and its peer dependencies.
 *
 * `packPublished(folder)` is also what `pnpm release:smoke` installs from.
 */
import { execFileSync } from 'node:child_process';
import { mkdirSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { buildWithProgress, root } from './turbo.mjs';

/** Every package under packages/ that is published: name, folder, @lockkit dependencies, peers. */
export function publishedPackages() {
  return readdirSync(join(root, 'packages'))
    .map((dir) => {
      const manifest = JSON.parse(
        readFileSync(join(root, 'packages', dir, 'package.json'), 'utf8'),
      );
      return {
        name: manifest.name,
        dir: join(root, 'packages', dir),
        private: manifest.private === true,
        command: manifest.bin !== undefined,
        lockkitDeps: Object.keys(manifest.dependencies ?? {}).filter((d) =>
          d.startsWith('@lockkit/'),
        ),
        peers: Object.keys(manifest.peerDependencies ?? {}),
      };
    })
    .filter((p) => !p.private);
}

/**
 * Packs every published package (built beforehand) into `folder`, which is emptied first.
 * Returns a map from package name to the tarball's path.
 */
export function packPublished(folder) {
  rmSync(folder, { recursive: true, force: true });
  mkdirSync(folder, { recursive: true });
  const tarballs = new Map();
  for (const pkg of publishedPackages()) {
    const before = new Set(readdirSync(folder));
    execFileSync('pnpm', ['pack', '--pack-destination', folder], { cwd: pkg.dir, stdio: 'ignore' });
    const made = readdirSync(folder).filter((f) => !before.has(f));
    if (made.length !== 1) throw new Error(`pnpm pack of ${pkg.name} made ${made.length} files`);
    tarballs.set(pkg.name, join(folder, made[0]));
  }
  return tarballs;
}

/** A package and the @lockkit packages it needs, depth first, each once. */
function withLockkitDeps(name, packages, seen = new Set()) {
  if (seen.has(name)) return [];
  seen.add(name);
  const pkg = packages.find((p) => p.name === name);
  return [name, ...(pkg?.lockkitDeps ?? []).flatMap((d) => withLockkitDeps(d, packages, seen))];
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  const packages = publishedPackages();
  await buildWithProgress(
    packages.map((p) => p.name),
    'the published packages',
  );
  const folder = join(root, 'tarballs');
  const tarballs = packPublished(folder);
  console.log(
    `packed ${tarballs.size} packages into ${folder} (ignored by git, remade by each run)`,
  );
  console.log(
    'to install one in another project, with the @lockkit packages it uses and its peers:\n',
  );
  for (const pkg of packages) {
    const files = withLockkitDeps(pkg.name, packages).map((n) => tarballs.get(n));
    // A package with a command (the CLI) is installed globally, to put it on PATH.
    const npmI = pkg.command ? 'npm i -g' : 'npm i';
    console.log(`${pkg.name}:\n  ${npmI} ${[...files, ...pkg.peers].join(' ')}`);
  }
}
