-- The agent's operation journal (docs/contract.md §9): each task-level operation's
-- idempotency key, stored before its first send, so that every retry and
-- every restart of the agent sends the same key. The agent's own file; no
-- service reads it.
CREATE TABLE agent_operations (
    -- the task's own name for the operation: what the agent calls it by
    name            TEXT    PRIMARY KEY,
    idempotency_key TEXT    NOT NULL UNIQUE,
    -- sha256 of the canonical JSON of what was intended (method, path,
    -- body; not the service's address): the same name with another payload
    -- is a new intention, refused
    payload_digest  TEXT    NOT NULL,
    method          TEXT    NOT NULL,
    target          TEXT    NOT NULL,
    -- `pending` until an outcome is known, then the outcome
    state           TEXT    NOT NULL CHECK (state IN ('pending', 'created', 'replayed', 'matched_existing',
                        'in_progress', 'conflict', 'awaiting_approval', 'unknown', 'failed')),
    operation_id    TEXT,
    result_status   INTEGER,
    result_body     TEXT,
    created_at      TEXT    NOT NULL,
    updated_at      TEXT    NOT NULL
) STRICT;

-- Every request the agent made for an operation, and what it learned: the
-- timeline of a scenario's report.
CREATE TABLE agent_attempts (
    seq    INTEGER PRIMARY KEY,
    name   TEXT    NOT NULL REFERENCES agent_operations (name),
    at     TEXT    NOT NULL,
    -- send: the operation's request; ask: its status; wait: a pause and why
    action TEXT    NOT NULL CHECK (action IN ('send', 'ask', 'wait')),
    status INTEGER,
    note   TEXT    NOT NULL
) STRICT;
CREATE INDEX agent_attempts_by_name ON agent_attempts (name, seq);
