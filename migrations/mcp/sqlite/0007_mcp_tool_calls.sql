-- The MCP server's journal of tool calls (docs/contract.md §13): what each
-- agent session asked for and what it was answered, so a dispute can match
-- the agent's request with the service's own journal by operation id. It
-- lives in the same file as the agent journal that holds each intent's key.
CREATE TABLE mcp_tool_calls (
    seq            INTEGER PRIMARY KEY,
    at             TEXT    NOT NULL,
    -- which MCP session made the call: `stdio …` or `http …`
    session        TEXT    NOT NULL,
    tool           TEXT    NOT NULL,
    intent         TEXT,
    idempotency_key TEXT,
    -- sha256 of the canonical JSON of the request the call asked for (the
    -- agent journal's payload digest); a changed retry shows as another one
    payload_digest TEXT,
    -- an Answer's outcome, or a tool error's code
    outcome        TEXT    NOT NULL,
    operation_id   TEXT,
    http_status    INTEGER,
    -- the approval a call was told to wait for: `get_approval` finds its
    -- operation by it (an agent's key reads approvals only through them)
    approval_id    TEXT
) STRICT;
CREATE INDEX mcp_tool_calls_by_approval ON mcp_tool_calls (approval_id) WHERE approval_id IS NOT NULL;
