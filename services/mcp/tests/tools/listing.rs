//! The tools as a client lists them: every write and read, with the
//! contract's annotations and schemas.

use platform::Backend;
use serde_json::json;

use crate::support::*;

const WRITES: [&str; 10] = [
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
];
const READS: [&str; 7] = [
    "get_operation",
    "get_ticket",
    "list_tickets",
    "get_payment_intent",
    "get_deployment",
    "get_environment",
    "get_approval",
];

async fn tools_are_listed_with_the_contracts_annotations_and_schemas(backend: Backend) {
    let world = World::start(backend).await;
    let mcp = world.connect().await;
    let tools = mcp.client.list_all_tools().await.unwrap();
    let mut names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    names.sort_unstable();
    let mut expected: Vec<&str> = WRITES.iter().chain(READS.iter()).copied().collect();
    expected.sort_unstable();
    assert_eq!(names, expected);
    for tool in &tools {
        let name = tool.name.as_ref();
        let hints = tool.annotations.as_ref().expect("every tool is annotated");
        let output = tool.output_schema.as_ref().expect("every tool declares its output");
        for member in [
            "outcome",
            "operation_id",
            "idempotency_key",
            "http_status",
            "resource",
            "next_step",
        ] {
            assert!(
                output["properties"].get(member).is_some(),
                "{name}'s output lacks {member}"
            );
        }
        let input = &tool.input_schema;
        assert!(
            input["properties"]
                .as_object()
                .unwrap()
                .keys()
                .all(|k| !k.contains("key") || k == "idempotency_key"),
            "{name} takes no API key"
        );
        let open_world = !name.contains("ticket") && !matches!(name, "get_operation" | "get_approval");
        assert_eq!(hints.open_world_hint, Some(open_world), "{name}: openWorldHint");
        if READS.contains(&name) {
            assert_eq!(hints.read_only_hint, Some(true), "{name} only reads");
            continue;
        }
        assert_eq!(hints.read_only_hint, Some(false), "{name} writes");
        assert_eq!(hints.idempotent_hint, Some(true), "{name} is idempotent by its intent");
        let destructive = matches!(
            name,
            "capture_payment" | "refund_payment" | "cancel_payment_intent" | "cancel_deployment" | "create_rollback"
        );
        assert_eq!(hints.destructive_hint, Some(destructive), "{name}: destructiveHint");
        assert!(input["properties"].get("intent").is_some(), "{name} takes an intent");
        assert!(tool.description.as_deref().unwrap().contains("same on every retry"));
    }
    // the schema is the service's: its limits and its enumerations
    let create = tools.iter().find(|t| t.name == "create_ticket").unwrap();
    assert_eq!(create.input_schema["properties"]["title"]["maxLength"], 200);
    assert_eq!(create.input_schema["required"], json!(["project", "title"]));
    assert_eq!(create.input_schema["additionalProperties"], false);
    let deploy = tools.iter().find(|t| t.name == "create_deployment").unwrap();
    assert_eq!(
        deploy.input_schema["properties"]["environment"]["enum"],
        json!(["development", "staging", "production"])
    );
    let capture = tools.iter().find(|t| t.name == "capture_payment").unwrap();
    assert!(capture.input_schema["properties"].get("payment_intent_id").is_some());
}

platform::both_backends!(tools_are_listed_with_the_contracts_annotations_and_schemas,);
