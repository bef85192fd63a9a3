-- Run once by the official image's entrypoint when it creates the database.
CREATE EXTENSION IF NOT EXISTS pg_stride;
