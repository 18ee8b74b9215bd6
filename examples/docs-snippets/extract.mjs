/**
 * Writes the ```ts blocks of the docs to generated/*.ts, for tsc to check against the built
 * packages:
 * - each block of docs/*.md as a module of its own (a guide's blocks each stand alone);
 * - each README below as one module, its blocks in order, because a README reads top to bottom
 *   (the second block uses the `locks` the first one made).
 * Blocks for other libraries are marked ```js and are left out.
 */
import { mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';

const root = resolve(import.meta.dirname, '../..');
const out = resolve(import.meta.dirname, 'generated');

// The READMEs whose examples are checked. Not (yet) the others: @lockkit/core's sections are
// fragments that use names no block defines; @lockkit/prisma's import the user's generated
// client; @lockkit/conformance's is an adapter's test file, importing the adapter's `../src`.
const READMES = [
  'README.md',
  'packages/pg/README.md',
  'packages/postgres/README.md',
  'packages/drizzle/README.md',
  'packages/kysely/README.md',
  'packages/typeorm/README.md',
  'packages/knex/README.md',
  'packages/otel/README.md',
  'packages/prometheus/README.md',
];

const tsBlocks = (file) =>
  [...readFileSync(join(root, file), 'utf8').matchAll(/^```ts\n([\s\S]*?)^```$/gm)].map(
    (m) => m[1],
  );

rmSync(out, { recursive: true, force: true });
mkdirSync(out);
let guides = 0;
let readmes = 0;
for (const file of readdirSync(join(root, 'docs')).filter((f) => f.endsWith('.md'))) {
  tsBlocks(`docs/${file}`).forEach((block, i) => {
    const name = `${file.replace(/\.md$/, '')}-${i + 1}.ts`;
    writeFileSync(join(out, name), `// From docs/${file}, block ${i + 1}.\n${block}\nexport {};\n`);
    guides++;
  });
}
for (const file of READMES) {
  const blocks = tsBlocks(file);
  if (blocks.length === 0) throw new Error(`${file} has no ts block left to check`);
  const name = `readme-${file.replace(/\/?README\.md$/, '').replaceAll('/', '-') || 'root'}.ts`;
  const body = blocks.map((b, i) => `// From ${file}, block ${i + 1}.\n${b}`).join('\n');
  writeFileSync(join(out, name), `${body}\nexport {};\n`);
  readmes += blocks.length;
}
if (guides === 0) throw new Error('no ts blocks found in docs/');
console.log(
  `docs-snippets: ${guides} blocks from docs/, ${readmes} from ${READMES.length} READMEs`,
);
