//! The server's journal: every call recorded, and each account's intents
//! and keys kept apart from another's.

use platform::Backend;
use serde_json::json;

use crate::support::*;

async fn every_call_is_journaled_with_its_session_intent_key_and_outcome(backend: Backend) {
    let world = World::start(backend).await;
    let project = unique("ops");
    let mcp = world.connect().await;
    let created = mcp
        .call("create_ticket", ticket("journaled", &project, "Disk full"))
        .await;
    mcp.call("create_ticket", ticket("journaled", &project, "Disk full"))
        .await;
    mcp.call("create_ticket", ticket("journaled", &project, "Changed"))
        .await;
    mcp.call("get_operation", json!({"intent": "journaled"})).await;
    let calls = mcp.gateway.calls().all().await.unwrap();
    let summary: Vec<(&str, &str)> = calls.iter().map(|c| (c.tool.as_str(), c.outcome.as_str())).collect();
    assert_eq!(
        summary,
        [
            ("create_ticket", "created"),
            ("create_ticket", "replayed"),
            ("create_ticket", "intent_reused_with_changed_payload"),
            ("get_operation", "found"),
        ]
    );
    let key = created.str("idempotency_key");
    let operation = created.str("operation_id");
    assert!(calls.iter().all(|c| c.idempotency_key.as_deref() == Some(key.as_str())));
    assert!(
        calls
            .iter()
            .all(|c| c.session.starts_with("stdio ") && c.session == calls[0].session)
    );
    assert_eq!(calls[0].intent.as_deref(), Some("journaled"));
    assert_eq!(calls[0].operation_id.as_deref(), Some(operation.as_str()));
    assert_eq!(calls[0].http_status, Some(201));
    assert_eq!(calls[0].payload_digest, calls[1].payload_digest);
    assert_ne!(
        calls[2].payload_digest, calls[0].payload_digest,
        "the changed payload shows"
    );
}

async fn a_refused_server_key_is_a_tool_error_and_the_intent_is_sent_again_once_it_is_fixed(backend: Backend) {
    let world = World::start(backend).await;
    let project = unique("ops");
    let mut config = world.config();
    config.tickets.api_key = "rs_not_a_key".into();
    let misconfigured = world.connect_with(config).await;
    let refused = misconfigured
        .call("create_ticket", ticket("after the fix", &project, "Disk full"))
        .await;
    assert_eq!(refused.error_code(), "api_key_refused");
    drop(misconfigured);

    let fixed = world.connect().await;
    let created = fixed
        .call("create_ticket", ticket("after the fix", &project, "Disk full"))
        .await;
    assert_eq!(
        created.outcome(),
        "created",
        "the refusal was not kept as the intent's outcome"
    );
    let journaled = fixed.gateway.calls().all().await.unwrap();
    assert_eq!(
        journaled[0].idempotency_key, journaled[1].idempotency_key,
        "the account's intent kept its key across the fix"
    );
    assert_eq!(world.tickets_in(&project).await.len(), 1);
}

async fn servers_that_share_a_journal_but_not_an_account_never_share_an_intent(backend: Backend) {
    let world = World::start(backend).await;
    let project = unique("ops");
    let acme = world.connect().await;
    let globex = world.connect_with(world.config_for("globex", GLOBEX_AGENT)).await;
    let for_acme = acme
        .call("create_ticket", ticket("the same words", &project, "Disk full"))
        .await;
    let for_globex = globex
        .call("create_ticket", ticket("the same words", &project, "Disk full"))
        .await;
    assert_eq!(for_acme.outcome(), "created");
    assert_eq!(
        for_globex.outcome(),
        "created",
        "globex's ticket is its own, not acme's replayed"
    );
    assert_ne!(for_globex.json["idempotency_key"], for_acme.json["idempotency_key"]);
    assert_ne!(for_globex.json["resource"]["id"], for_acme.json["resource"]["id"]);
    globex
        .call("create_ticket", ticket("globex's words alone", &project, "Disk full"))
        .await
        .outcome();
    let never_acmes = acme
        .call("get_operation", json!({"intent": "globex's words alone"}))
        .await;
    assert_eq!(never_acmes.outcome(), "not_found");
    assert_eq!(never_acmes.next_step(), "call again with the same intent");
}

async fn a_key_another_account_sent_through_the_same_journal_is_not_this_accounts(backend: Backend) {
    let world = World::start(backend).await;
    let project = unique("ops");
    let acme = world.connect().await;
    let globex = world.connect_with(world.config_for("globex", GLOBEX_AGENT)).await;
    let key = uuid::Uuid::new_v4().to_string();
    let sent = json!({"idempotency_key": key, "project": project, "title": "Disk full"});
    let for_globex = globex.call("create_ticket", sent.clone()).await;
    assert_eq!(for_globex.outcome(), "created");

    let before = acme.call("get_operation", json!({"idempotency_key": key})).await;
    assert_eq!(before.outcome(), "not_found");
    assert_eq!(
        before.next_step(),
        "call again with the same intent",
        "acme never sent this key: nothing of acme's is done"
    );
    let for_acme = acme.call("create_ticket", sent).await;
    assert_eq!(
        for_acme.outcome(),
        "created",
        "acme's own operation, not a journal error"
    );
    assert_eq!(for_acme.str("idempotency_key"), key);
    assert_ne!(for_acme.json["operation_id"], for_globex.json["operation_id"]);
    assert_ne!(for_acme.json["resource"]["id"], for_globex.json["resource"]["id"]);
    let after = acme.call("get_operation", json!({"idempotency_key": key})).await;
    assert_eq!(after.outcome(), "found");
    assert_eq!(after.json["operation_id"], for_acme.json["operation_id"]);
    assert_eq!(world.tickets_in(&project).await.len(), 1, "acme's one ticket");
}

async fn a_failing_journal_is_a_tool_error_that_carries_none_of_the_databases_text(backend: Backend) {
    let world = World::start(backend).await;
    let project = unique("ops");
    let mcp = world.connect().await;
    let created = mcp
        .call("create_ticket", ticket("before the failure", &project, "Disk full"))
        .await;
    assert_eq!(created.outcome(), "created");
    // the journal's tables go away under the running server
    let file = sqlx::SqlitePool::connect(&format!("sqlite://{}", world.journal_path().display()))
        .await
        .unwrap();
    for gone in [
        "ALTER TABLE agent_operations RENAME TO intents_elsewhere",
        "ALTER TABLE mcp_tool_calls RENAME TO calls_elsewhere",
    ] {
        sqlx::query(gone).execute(&file).await.unwrap();
    }

    let failed = [
        mcp.call("create_ticket", ticket("after the failure", &project, "Disk full"))
            .await,
        mcp.call("get_operation", json!({"intent": "before the failure"})).await,
        mcp.call(
            "get_operation",
            json!({"idempotency_key": created.str("idempotency_key")}),
        )
        .await,
        mcp.call("get_approval", json!({"approval_id": "apr_any"})).await,
    ];
    for call in failed {
        assert_eq!(call.error_code(), "journal_unavailable");
        let detail = call.str("detail").to_lowercase();
        for database_text in [
            "sqlite",
            "database",
            "no such table",
            "agent_operations",
            "mcp_tool_calls",
        ] {
            assert!(
                !detail.contains(database_text),
                "the database's text reached the agent: {detail}"
            );
        }
    }
    assert_eq!(world.tickets_in(&project).await.len(), 1, "nothing more was sent");
}

async fn a_key_one_of_the_accounts_intents_holds_is_refused_for_another_request(backend: Backend) {
    let world = World::start(backend).await;
    let project = unique("ops");
    let mcp = world.connect().await;
    let created = mcp
        .call("create_ticket", ticket("the intent", &project, "Disk full"))
        .await;
    assert_eq!(created.outcome(), "created");
    let sent = world.tickets_proxy.passed().len();

    let reused = mcp
        .call(
            "create_ticket",
            json!({"idempotency_key": created.str("idempotency_key"), "project": project, "title": "Disk almost full"}),
        )
        .await;

    assert_eq!(reused.error_code(), "idempotency_key_reused");
    assert_eq!(world.tickets_proxy.passed().len(), sent, "nothing was sent");
    assert_eq!(world.tickets_in(&project).await.len(), 1);
}

async fn a_journal_made_before_accounts_keeps_each_accounts_intents_and_approval_waits(backend: Backend) {
    let world = World::start(backend).await;
    let project = unique("ops");
    let [acme_key, globex_key] = [(); 2].map(|()| uuid::Uuid::new_v4().to_string());
    let request = agent::Request::post(
        &world.tickets_proxy.url,
        "/v1/tickets",
        json!({"project": project, "title": "Disk full"}),
    );
    // the file as the MCP server left it before its journal kept accounts
    let old = sqlx::SqlitePool::connect_with(
        sqlx::sqlite::SqliteConnectOptions::new()
            .filename(world.journal_path())
            .create_if_missing(true),
    )
    .await
    .unwrap();
    sqlx::migrate!("../../migrations/agent/sqlite")
        .run_to(6, &old)
        .await
        .unwrap();
    let mut calls = sqlx::migrate!("../../migrations/mcp/sqlite");
    calls.dangerous_set_table_name("_mcp_migrations");
    calls.run_to(7, &old).await.unwrap();
    for (name, key) in [
        ("intent:account acme:ship it", &acme_key),
        ("intent:account globex:ship it", &globex_key),
    ] {
        sqlx::query(
            "INSERT INTO agent_operations (name, idempotency_key, payload_digest, method, target, state, \
             created_at, updated_at) VALUES ($1, $2, $3, 'POST', $4, 'pending', '2020-01-01T00:00:00Z', \
             '2020-01-01T00:00:00Z')",
        )
        .bind(name)
        .bind(key)
        .bind(agent::journal::payload_digest(&request))
        .bind(request.target())
        .execute(&old)
        .await
        .unwrap();
    }
    sqlx::query(
        "INSERT INTO mcp_tool_calls (at, session, tool, intent, idempotency_key, outcome, operation_id, approval_id) \
         VALUES ('2020-01-01T00:00:00Z', 'stdio 1', 'create_ticket', 'ship it', $1, 'awaiting_approval', 'op_1', \
         'apr_1')",
    )
    .bind(&acme_key)
    .execute(&old)
    .await
    .unwrap();
    old.close().await;

    let acme = world.connect().await;
    let globex = world.connect_with(world.config_for("globex", GLOBEX_AGENT)).await;
    let arguments = ticket("ship it", &project, "Disk full");
    let for_acme = acme.call("create_ticket", arguments.clone()).await;
    let for_globex = globex.call("create_ticket", arguments).await;
    let waited = |account: &str| {
        let calls = acme.gateway.calls().clone();
        let account = agent::Account::named(account);
        async move { calls.waiting_for(&account, "apr_1").await.unwrap() }
    };

    assert_eq!(for_acme.outcome(), "created");
    assert_eq!(for_acme.str("idempotency_key"), acme_key, "acme's intent kept its key");
    assert_eq!(for_globex.outcome(), "created");
    assert_eq!(for_globex.str("idempotency_key"), globex_key, "and globex's its own");
    assert_eq!(waited("acme").await, Some(("create_ticket".into(), "op_1".into())));
    assert_eq!(waited("globex").await, None, "acme's approval wait is not globex's");
}

platform::both_backends!(
    every_call_is_journaled_with_its_session_intent_key_and_outcome,
    a_refused_server_key_is_a_tool_error_and_the_intent_is_sent_again_once_it_is_fixed,
    servers_that_share_a_journal_but_not_an_account_never_share_an_intent,
    a_key_another_account_sent_through_the_same_journal_is_not_this_accounts,
    a_failing_journal_is_a_tool_error_that_carries_none_of_the_databases_text,
    a_key_one_of_the_accounts_intents_holds_is_refused_for_another_request,
    a_journal_made_before_accounts_keeps_each_accounts_intents_and_approval_waits,
);
