"""The MCP server as an outside client sees it: the Python MCP SDK (pinned in
.ci/mcp-requirements.txt), over stdio (target/debug/mcp spawned per test)
and over streamable HTTP (the sandbox's /mcp). Every test runs on both.

.ci/mcp starts a sandbox on ports of its own and sets:

  MCP_TEST_HTTP_URL      the sandbox's streamable HTTP endpoint (…/mcp)
  MCP_TICKETS_URL, MCP_PAYMENTS_URL, MCP_DEPLOYMENTS_URL
                         the sandbox's services: the stdio server calls them,
                         and the tests read them over plain HTTP
  MCP_TEST_BINARY        the stdio server (target/debug/mcp)
  MCP_TEST_OUT           where the stdio servers' logs go

Every name a test makes (intents, projects, services) is unique to the run,
so the suite can run again on the same sandbox.
"""

from __future__ import annotations

import json
import os
import secrets
import time
import urllib.parse
import urllib.request
import uuid
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

HTTP_URL = os.environ["MCP_TEST_HTTP_URL"]
SERVICES = {
    "tickets": os.environ["MCP_TICKETS_URL"],
    "payments": os.environ["MCP_PAYMENTS_URL"],
    "deployments": os.environ["MCP_DEPLOYMENTS_URL"],
}
BINARY = os.environ["MCP_TEST_BINARY"]
OUT = Path(os.environ["MCP_TEST_OUT"])

AGENT_KEY = "demo-acme-agent"
APPROVER_KEY = "demo-acme-approver"
# one call's bound: a hung server fails the test instead of the CI run
CALL_SECONDS = 60
RUN = uuid.uuid4().hex[:10]

TICKET_TOOLS = {"create_ticket", "comment_on_ticket", "set_ticket_status", "get_ticket", "list_tickets"}
PAYMENT_TOOLS = {
    "create_payment_intent",
    "capture_payment",
    "refund_payment",
    "cancel_payment_intent",
    "get_payment_intent",
}
DEPLOYMENT_TOOLS = {
    "create_deployment",
    "cancel_deployment",
    "create_rollback",
    "get_deployment",
    "get_environment",
}
WRITE_TOOLS = {
    "create_ticket",
    "comment_on_ticket",
    "set_ticket_status",
    "create_payment_intent",
    "capture_payment",
    "refund_payment",
    "cancel_payment_intent",
    "create_deployment",
    "cancel_deployment",
    "create_rollback",
}
READ_TOOLS = {
    "get_operation",
    "get_ticket",
    "list_tickets",
    "get_payment_intent",
    "get_deployment",
    "get_environment",
    "get_approval",
}
DESTRUCTIVE_TOOLS = {
    "cancel_payment_intent",
    "cancel_deployment",
    "create_rollback",
    "capture_payment",
    "refund_payment",
}
ANSWER_FIELDS = {"outcome", "operation_id", "idempotency_key", "http_status", "resource", "next_step"}


# --- the two transports ---------------------------------------------------


@asynccontextmanager
async def connect(transport: str, name: str) -> AsyncIterator[ClientSession]:
    """An initialized client session to the MCP server over `transport`."""
    if transport == "stdio":
        work = OUT / "stdio" / name
        work.mkdir(parents=True, exist_ok=True)
        server = StdioServerParameters(
            command=BINARY,
            env={
                "MCP_TICKETS_URL": SERVICES["tickets"],
                "MCP_PAYMENTS_URL": SERVICES["payments"],
                "MCP_DEPLOYMENTS_URL": SERVICES["deployments"],
                # the sandbox account whose demo agent key the server calls with
                "MCP_ACCOUNT": "acme",
                # a journal of this server's own, fresh for each test
                "MCP_JOURNAL": str(work / "journal.db"),
                "RETRYSAFE_DATA_DIR": str(work),
                "NO_COLOR": "1",
            },
        )
        with open(work / "server.log", "a") as log:
            async with stdio_client(server, errlog=log) as (read, write):
                async with ClientSession(read, write, read_timeout_seconds=CALL_SECONDS) as session:
                    await session.initialize()
                    yield session
    else:
        async with streamable_http_client(HTTP_URL) as streams:
            read, write = streams[0], streams[1]
            async with ClientSession(read, write, read_timeout_seconds=CALL_SECONDS) as session:
                await session.initialize()
                yield session


@pytest.fixture(params=["stdio", "streamable_http"])
def transport(request: pytest.FixtureRequest) -> str:
    return request.param


def run(transport: str, name: str, scenario: Callable[[ClientSession], Awaitable[None]]) -> None:
    """Runs `scenario` with a session over `transport`, bounded in time."""

    async def main() -> None:
        with anyio.fail_after(4 * CALL_SECONDS):
            async with connect(transport, name) as session:
                await scenario(session)

    anyio.run(main)


# --- what a call answers --------------------------------------------------


async def answer(session: ClientSession, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """The structured answer of a call that must not be a tool error."""
    result = await session.call_tool(tool, arguments)
    assert not result.is_error, f"{tool} answered a tool error: {text_of(result)}"
    assert isinstance(result.structured_content, dict), f"{tool} answered no structuredContent"
    # the text content is the same answer, for clients that read only text
    assert json.loads(text_of(result)) == result.structured_content
    return result.structured_content


async def tool_error(session: ClientSession, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """The error of a call that must be a tool error (`isError: true`)."""
    result = await session.call_tool(tool, arguments)
    assert result.is_error, f"{tool} did not answer a tool error: {result.structured_content}"
    return json.loads(text_of(result))


def text_of(result: Any) -> str:
    texts = [block.text for block in result.content if getattr(block, "type", None) == "text"]
    assert len(texts) == 1, f"expected one text content, got {result.content!r}"
    return texts[0]


# --- the services over plain HTTP, as a person or another client sees them --


def service_get(service: str, path: str, key: str = AGENT_KEY, **query: str) -> Any:
    url = SERVICES[service] + path
    if query:
        url += "?" + urllib.parse.urlencode(query)
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def service_post(service: str, path: str, body: dict[str, Any], key: str) -> tuple[int, Any]:
    request = urllib.request.Request(
        SERVICES[service] + path,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status, json.load(response)


def tickets_of(project: str) -> list[dict[str, Any]]:
    return service_get("tickets", "/v1/tickets", project=project)["data"]


def unique(what: str, transport: str) -> str:
    """A name no other test or run uses, fit for a service name (a-z, 0-9, '-')."""
    return f"{what}-{RUN}-{transport.replace('_', '-')}-{secrets.token_hex(4)}"


async def tools_by_name(session: ClientSession) -> dict[str, Any]:
    listing = await session.list_tools()
    assert listing.next_cursor is None, "every tool fits on one page"
    return {tool.name: tool for tool in listing.tools}


def property_names(schema: Any) -> set[str]:
    """Every property name a JSON Schema declares, at any depth (`$defs` too)."""
    names: set[str] = set()
    if isinstance(schema, dict):
        if isinstance(schema.get("properties"), dict):
            names |= set(schema["properties"])
        for value in schema.values():
            names |= property_names(value)
    elif isinstance(schema, list):
        for value in schema:
            names |= property_names(value)
    return names


# --- tools/list -----------------------------------------------------------


def test_tools_list_names_exactly_the_seventeen_tools_of_the_contract(transport: str) -> None:
    async def scenario(session: ClientSession) -> None:
        tools = await tools_by_name(session)
        assert set(tools) == WRITE_TOOLS | READ_TOOLS
        assert len(tools) == 17

    run(transport, "tools-names", scenario)


def test_read_tools_say_they_only_read(transport: str) -> None:
    async def scenario(session: ClientSession) -> None:
        tools = await tools_by_name(session)
        for name in READ_TOOLS:
            assert tools[name].annotations is not None, name
            assert tools[name].annotations.read_only_hint is True, name

    run(transport, "tools-reads", scenario)


def test_write_tools_say_they_change_things_and_are_idempotent(transport: str) -> None:
    async def scenario(session: ClientSession) -> None:
        tools = await tools_by_name(session)
        for name in WRITE_TOOLS:
            annotations = tools[name].annotations
            assert annotations is not None, name
            assert annotations.read_only_hint is False, name
            assert annotations.idempotent_hint is True, name

    run(transport, "tools-writes", scenario)


def test_cancels_captures_refunds_and_rollbacks_are_destructive_and_creating_a_ticket_is_not(
    transport: str,
) -> None:
    async def scenario(session: ClientSession) -> None:
        tools = await tools_by_name(session)
        for name in DESTRUCTIVE_TOOLS:
            assert tools[name].annotations.destructive_hint is True, name
        assert tools["create_ticket"].annotations.destructive_hint is False

    run(transport, "tools-destructive", scenario)


def test_payments_and_deployments_tools_reach_the_open_world_and_ticket_tools_do_not(transport: str) -> None:
    async def scenario(session: ClientSession) -> None:
        tools = await tools_by_name(session)
        for name in PAYMENT_TOOLS | DEPLOYMENT_TOOLS:
            assert tools[name].annotations.open_world_hint is True, name
        for name in TICKET_TOOLS:
            assert tools[name].annotations.open_world_hint is False, name

    run(transport, "tools-open-world", scenario)


def test_every_tool_declares_the_answer_as_its_output_schema(transport: str) -> None:
    async def scenario(session: ClientSession) -> None:
        tools = await tools_by_name(session)
        for name, tool in tools.items():
            assert tool.output_schema is not None, f"{name} declares no outputSchema"
            assert tool.output_schema.get("type") == "object", name
            assert ANSWER_FIELDS <= set(tool.output_schema.get("properties", {})), name

    run(transport, "tools-output-schema", scenario)


def test_no_tool_takes_an_api_key(transport: str) -> None:
    def names_a_credential(name: str) -> bool:
        flat = name.lower().replace("-", "").replace("_", "")
        return any(word in flat for word in ("apikey", "token", "authorization", "bearer"))

    async def scenario(session: ClientSession) -> None:
        tools = await tools_by_name(session)
        for name, tool in tools.items():
            # the schema is there and has properties, so the check below looks at something
            assert tool.input_schema.get("type") == "object", name
            credentials = {p for p in property_names(tool.input_schema) if names_a_credential(p)}
            assert credentials == set(), f"{name} takes {credentials}"
        assert "intent" in tools["create_ticket"].input_schema["properties"]

    run(transport, "tools-no-key", scenario)


# --- writes with an intent ------------------------------------------------


def test_create_ticket_twice_with_one_intent_creates_one_ticket_and_replays_the_first_answer(
    transport: str,
) -> None:
    project = unique("mcp-replay", transport)
    arguments = {"intent": unique("ticket", transport), "project": project, "title": "Disk full on db-1"}

    async def scenario(session: ClientSession) -> None:
        first = await answer(session, "create_ticket", arguments)
        assert first["outcome"] == "created"
        assert first["next_step"] == "done"
        assert first["http_status"] == 201
        assert first["operation_id"].startswith("op_")
        assert first["idempotency_key"]
        assert first["resource"]["project"] == project

        second = await answer(session, "create_ticket", arguments)
        assert second["outcome"] == "replayed"
        assert second["next_step"] == "done"
        assert second["operation_id"] == first["operation_id"]
        assert second["idempotency_key"] == first["idempotency_key"]
        assert second["resource"]["id"] == first["resource"]["id"]

        tickets = tickets_of(project)
        assert [t["id"] for t in tickets] == [first["resource"]["id"]]

    run(transport, "ticket-replay", scenario)


def test_the_same_intent_with_a_changed_title_is_refused_and_nothing_is_sent(transport: str) -> None:
    project = unique("mcp-changed", transport)
    intent = unique("ticket", transport)

    async def scenario(session: ClientSession) -> None:
        first = await answer(session, "create_ticket", {"intent": intent, "project": project, "title": "Cert expires"})
        assert first["outcome"] == "created"

        error = await tool_error(
            session, "create_ticket", {"intent": intent, "project": project, "title": "Cert expired"}
        )
        assert error["code"] == "intent_reused_with_changed_payload"

        tickets = tickets_of(project)
        assert len(tickets) == 1
        assert tickets[0]["title"] == "Cert expires"

    run(transport, "ticket-changed", scenario)


def test_a_blank_title_is_refused_as_invalid_input_and_nothing_is_created(transport: str) -> None:
    project = unique("mcp-blank", transport)

    async def scenario(session: ClientSession) -> None:
        error = await tool_error(
            session, "create_ticket", {"intent": unique("ticket", transport), "project": project, "title": "   "}
        )
        assert error["code"] == "invalid_input"
        assert any(e["field"] == "title" for e in error.get("errors", [])), error
        assert tickets_of(project) == []

    run(transport, "ticket-blank", scenario)


def test_a_write_refuses_an_api_key_among_its_arguments_and_sends_nothing(transport: str) -> None:
    project = unique("mcp-key", transport)

    async def scenario(session: ClientSession) -> None:
        error = await tool_error(
            session,
            "create_ticket",
            {
                "intent": unique("ticket", transport),
                "project": project,
                "title": "Escalate",
                "api_key": APPROVER_KEY,
            },
        )
        assert error["code"] == "invalid_input"
        assert APPROVER_KEY not in json.dumps(error), "the error echoes the key"
        assert tickets_of(project) == []

    run(transport, "ticket-api-key", scenario)


def test_get_operation_finds_a_write_by_its_idempotency_key_and_by_its_intent(transport: str) -> None:
    intent = unique("ticket", transport)
    project = unique("mcp-operation", transport)

    async def scenario(session: ClientSession) -> None:
        created = await answer(session, "create_ticket", {"intent": intent, "project": project, "title": "Look up"})
        assert created["outcome"] == "created"

        by_key = await answer(session, "get_operation", {"idempotency_key": created["idempotency_key"]})
        assert by_key["outcome"] == "found"
        assert by_key["operation_id"] == created["operation_id"]
        assert by_key["idempotency_key"] == created["idempotency_key"]
        assert by_key["resource"]["state"] == "completed"
        assert by_key["next_step"] == "done"

        by_intent = await answer(session, "get_operation", {"intent": intent})
        assert by_intent["outcome"] == "found"
        assert by_intent["operation_id"] == created["operation_id"]
        assert by_intent["idempotency_key"] == created["idempotency_key"]

        by_id = await answer(session, "get_operation", {"operation_id": created["operation_id"]})
        assert by_id["outcome"] == "found"
        assert by_id["operation_id"] == created["operation_id"]

    run(transport, "operation-lookup", scenario)


def test_a_production_deployment_waits_for_approval_and_runs_on_the_same_call_once_approved(
    transport: str,
) -> None:
    service = unique("svc", transport)
    arguments = {
        "intent": unique("deploy", transport),
        "service": service,
        "environment": "production",
        "artifact_digest": "sha256:" + secrets.token_hex(32),
    }

    async def scenario(session: ClientSession) -> None:
        waiting = await answer(session, "create_deployment", arguments)
        assert waiting["outcome"] == "awaiting_approval"
        assert waiting["next_step"] == "wait for approval"
        assert waiting["http_status"] == 202
        approval_id = waiting["approval"]["approval_id"]
        assert approval_id.startswith("apr_")
        assert service in json.dumps(waiting["approval"]["summary"])

        # nothing runs before a human decides: the same call waits again
        still_waiting = await answer(session, "create_deployment", arguments)
        assert still_waiting["outcome"] == "awaiting_approval"
        assert still_waiting["operation_id"] == waiting["operation_id"]

        pending = await answer(session, "get_approval", {"approval_id": approval_id})
        assert pending["outcome"] == "found"
        assert pending["resource"]["state"] == "pending"
        assert pending["next_step"] == "wait for approval"

        # the approver, over plain HTTP, approves what they were shown
        approval = service_get("deployments", f"/v1/approvals/{approval_id}", key=APPROVER_KEY)
        assert approval["operation_id"] == waiting["operation_id"]
        assert approval["state"] == "pending"
        status, decided = service_post(
            "deployments",
            f"/v1/approvals/{approval_id}/decision",
            {"decision": "approve", "fingerprint": approval["fingerprint"]},
            key=APPROVER_KEY,
        )
        assert status == 200
        assert decided["state"] == "approved"

        approved = await answer(session, "get_approval", {"approval_id": approval_id})
        assert approved["resource"]["state"] == "approved"
        assert approved["next_step"] == "call again with the same intent"

        # the same call with the same intent now runs it: the service does it on this retry
        ran = await answer(session, "create_deployment", arguments)
        assert ran["outcome"] == "created"
        assert ran["http_status"] == 202
        assert ran["next_step"] == "poll get_operation"
        assert ran["operation_id"] == waiting["operation_id"]
        assert ran["idempotency_key"] == waiting["idempotency_key"]
        assert ran["resource"]["service"] == service
        assert ran["resource"]["state"] == "queued"
        assert ran["approval"] is None

        # the operation goes on and completes: the rollout succeeds
        deadline = time.monotonic() + 30
        while True:
            operation = await answer(session, "get_operation", {"idempotency_key": ran["idempotency_key"]})
            assert operation["outcome"] == "found"
            assert operation["operation_id"] == waiting["operation_id"]
            assert operation["resource"]["state"] != "awaiting_approval"
            if operation["resource"]["state"] == "completed" or time.monotonic() > deadline:
                break
            await anyio.sleep(0.3)
        assert operation["resource"]["state"] == "completed"
        assert operation["next_step"] == "done"
        environment = service_get("deployments", f"/v1/environments/{service}/production")
        assert environment["current"]["id"] == ran["resource"]["id"]

        # and calling again once more only replays it
        again = await answer(session, "create_deployment", arguments)
        assert again["outcome"] == "replayed"
        assert again["operation_id"] == waiting["operation_id"]
        assert again["resource"]["id"] == ran["resource"]["id"]

    run(transport, "deployment-approval", scenario)
