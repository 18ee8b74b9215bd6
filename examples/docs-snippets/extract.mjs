/**
 * Writes every ```ts block of docs/*.md to generated/<guide>-<n>.ts, one module each, for tsc to
 * check. Blocks for other libraries are marked ```js in the guides and are left out.
 */
import { mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';

const docs = resolve(import.meta.dirname, '../../docs');
const out = resolve(import.meta.dirname, 'generated');
rmSync(out, { recursive: true, force: true });
mkdirSync(out);
let count = 0;
for (const file of readdirSync(docs).filter((f) => f.endsWith('.md'))) {
  const blocks = [...readFileSync(join(docs, file), 'utf8').matchAll(/^```ts\n([\s\S]*?)^```$/gm)];
  blocks.forEach((block, i) => {
    const name = `${file.replace(/\.md$/, '')}-${i + 1}.ts`;
    writeFileSync(
      join(out, name),
      `// From docs/${file}, block ${i + 1}.\n${block[1]}\nexport {};\n`,
    );
    count++;
  });
}
if (count === 0) throw new Error('no ts blocks found in docs/');
console.log(`docs-snippets: ${count} blocks from docs/ to type-check`);
