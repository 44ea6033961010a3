-- Which store this is: a random id made once per database and prefix, read
-- by every sidecar at start and announced in the mesh hello, so that
-- sidecars on different stores refuse to link. Not a secret.
CREATE TABLE IF NOT EXISTS {prefix}_meta (
    key   text PRIMARY KEY,
    value text NOT NULL
);

INSERT INTO {prefix}_meta (key, value)
VALUES ('store_id', md5(random()::text || clock_timestamp()::text || pg_backend_pid()::text))
ON CONFLICT (key) DO NOTHING;
