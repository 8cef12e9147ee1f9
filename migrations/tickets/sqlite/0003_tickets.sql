-- Tickets and their comments. `seq` orders lists and cursors; `id` is the public id.
-- Times are fixed-width RFC 3339 UTC text (platform::time::Timestamp).
CREATE TABLE tickets (
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,
    id              TEXT    NOT NULL UNIQUE,
    account_id      TEXT    NOT NULL,
    project         TEXT    NOT NULL,
    title           TEXT    NOT NULL,
    description     TEXT,
    priority        TEXT    NOT NULL CHECK (priority IN ('low', 'normal', 'high', 'urgent')),
    status          TEXT    NOT NULL CHECK (status IN ('open', 'acknowledged', 'resolved', 'closed')),
    source_event_id TEXT,
    -- a JSON array of strings: the service never queries inside it
    labels          TEXT    NOT NULL DEFAULT '[]',
    version         INTEGER NOT NULL DEFAULT 1 CHECK (version >= 1),
    created_at      TEXT    NOT NULL,
    updated_at      TEXT    NOT NULL
) STRICT;

-- Business identity: one ticket per alert event and project, whatever key the
-- caller used. NULLs are distinct, so tickets without a source event never collide.
CREATE UNIQUE INDEX tickets_one_per_source_event ON tickets (account_id, project, source_event_id);
CREATE INDEX tickets_by_account ON tickets (account_id, seq);

CREATE TABLE ticket_comments (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    id         TEXT    NOT NULL UNIQUE,
    account_id TEXT    NOT NULL,
    ticket_id  TEXT    NOT NULL REFERENCES tickets (id),
    body       TEXT    NOT NULL,
    author_id  TEXT    NOT NULL,
    created_at TEXT    NOT NULL,
    updated_at TEXT    NOT NULL
) STRICT;
CREATE INDEX ticket_comments_by_ticket ON ticket_comments (ticket_id, seq);
