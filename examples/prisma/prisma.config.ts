// Prisma 7 reads the datasource URL from here; generating the client needs no database.
import { defineConfig } from 'prisma/config';

export default defineConfig({
  schema: 'prisma/schema.prisma',
  datasource: { url: process.env.DATABASE_URL ?? 'postgres://localhost/unused' },
});
