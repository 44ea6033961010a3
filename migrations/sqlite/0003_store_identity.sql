-- Which store this is: a random id made once, read by every sidecar that
-- opens the file and announced in the mesh hello, so that sidecars on
-- different stores refuse to link. Not a secret.
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY NOT NULL,
    value TEXT NOT NULL
) WITHOUT ROWID;

INSERT OR IGNORE INTO meta (key, value) VALUES ('store_id', lower(hex(randomblob(16))));
