-- Tickets and their comments. `list_seq` orders lists and cursors (see
-- platform::page); `id` is the public id.
-- Times are fixed-width RFC 3339 UTC text (platform::time::Timestamp).
CREATE TABLE tickets (
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,
    -- its place in the account's lists, given in commit order when a list is read
    list_seq        INTEGER,
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
CREATE UNIQUE INDEX tickets_listed ON tickets (account_id, list_seq);

CREATE TABLE ticket_comments (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    -- its place in the account's lists, given in commit order when a list is read
    list_seq   INTEGER,
    id         TEXT    NOT NULL UNIQUE,
    account_id TEXT    NOT NULL,
    ticket_id  TEXT    NOT NULL REFERENCES tickets (id),
    body       TEXT    NOT NULL,
    author_id  TEXT    NOT NULL,
    created_at TEXT    NOT NULL,
    updated_at TEXT    NOT NULL
) STRICT;
CREATE INDEX ticket_comments_by_ticket ON ticket_comments (ticket_id, list_seq);
CREATE UNIQUE INDEX ticket_comments_listed ON ticket_comments (account_id, list_seq);
