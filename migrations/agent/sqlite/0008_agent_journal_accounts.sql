-- The agent's journal, keyed by account (docs/contract.md §9, §13): a name
-- and a key are unique per account, not per file, so agents and MCP servers
-- that act for different accounts can share one journal and never find each
-- other's operations. An account is `account <id>` when one is named, else
-- `key <mark>` (a prefix of the API key's SHA-256, never the key).
--
-- Rows already in the journal keep their keys under the account they were
-- made for, so a retry after the upgrade sends the key stored before it:
-- - the MCP server's names carry their account, `intent:<account>:<intent>`
--   and `key:<account>:<key>`: the account moves to its column and the name
--   becomes `intent:<intent>`, `key:<key>`;
-- - any other operation was made by an agent the journal did not tell apart:
--   it is left unclaimed (account ''), and the first account that names it
--   takes it, with its attempts.

ALTER TABLE agent_operations RENAME TO agent_operations_before_accounts;
ALTER TABLE agent_attempts RENAME TO agent_attempts_before_accounts;

CREATE TABLE agent_operations (
    -- whose operation: `account <id>`, `key <mark>`, or '' (made before the
    -- journal kept accounts, not yet claimed)
    account         TEXT    NOT NULL,
    -- the task's own name for the operation: what the agent calls it by
    name            TEXT    NOT NULL,
    idempotency_key TEXT    NOT NULL,
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
    updated_at      TEXT    NOT NULL,
    PRIMARY KEY (account, name),
    UNIQUE (account, idempotency_key)
) STRICT;

-- Every request the agent made for an operation, and what it learned: the
-- timeline of a scenario's report. An operation claimed by an account takes
-- its attempts along (ON UPDATE CASCADE).
CREATE TABLE agent_attempts (
    seq     INTEGER PRIMARY KEY,
    account TEXT    NOT NULL,
    name    TEXT    NOT NULL,
    at      TEXT    NOT NULL,
    -- send: the operation's request; ask: its status; wait: a pause and why
    action  TEXT    NOT NULL CHECK (action IN ('send', 'ask', 'wait')),
    status  INTEGER,
    note    TEXT    NOT NULL,
    FOREIGN KEY (account, name) REFERENCES agent_operations (account, name) ON UPDATE CASCADE
) STRICT;

-- Each old name, split: `scoped` when the MCP server made it with its
-- account inside (an account id never holds a `:`).
CREATE TEMP TABLE journal_names AS
SELECT old_name, kind, rest,
       kind IN ('intent:', 'key:') AND (rest GLOB 'account *:*' OR rest GLOB 'key *:*') AS scoped
FROM (SELECT name AS old_name,
             substr(name, 1, instr(name, ':')) AS kind,
             substr(name, instr(name, ':') + 1) AS rest
      FROM agent_operations_before_accounts);

CREATE TEMP TABLE journal_accounts AS
SELECT old_name,
       CASE WHEN scoped THEN substr(rest, 1, instr(rest, ':') - 1) ELSE '' END AS account,
       CASE WHEN scoped THEN kind || substr(rest, instr(rest, ':') + 1) ELSE old_name END AS name
FROM journal_names;

INSERT INTO agent_operations (account, name, idempotency_key, payload_digest, method, target, state,
                              operation_id, result_status, result_body, created_at, updated_at)
SELECT m.account, m.name, o.idempotency_key, o.payload_digest, o.method, o.target, o.state,
       o.operation_id, o.result_status, o.result_body, o.created_at, o.updated_at
FROM agent_operations_before_accounts o JOIN journal_accounts m ON m.old_name = o.name;

INSERT INTO agent_attempts (seq, account, name, at, action, status, note)
SELECT a.seq, m.account, m.name, a.at, a.action, a.status, a.note
FROM agent_attempts_before_accounts a JOIN journal_accounts m ON m.old_name = a.name;

DROP TABLE journal_accounts;
DROP TABLE journal_names;
DROP TABLE agent_attempts_before_accounts;
DROP TABLE agent_operations_before_accounts;

CREATE INDEX agent_attempts_by_name ON agent_attempts (account, name, seq);
