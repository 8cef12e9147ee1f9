-- Each tool call under the account it acted for (docs/contract.md §13), as
-- the agent journal keeps each intent: `get_approval` finds the call that
-- waited for an approval among its own account's calls alone. NULL: a call
-- that asked every service of a server whose services are different
-- accounts'.
ALTER TABLE mcp_tool_calls ADD COLUMN account TEXT;

-- A call made before: the account of the operation its key names in the
-- agent journal (upgraded first, in the same file), when exactly one does.
UPDATE mcp_tool_calls
SET account = (SELECT CASE WHEN COUNT(*) = 1 THEN NULLIF(MIN(o.account), '') END
               FROM agent_operations o
               WHERE o.idempotency_key = mcp_tool_calls.idempotency_key)
WHERE idempotency_key IS NOT NULL;
