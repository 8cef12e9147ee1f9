//! The tools of docs/contract.md §13, each a thin map onto one endpoint.
//! Their input schemas come from the services' OpenAPI documents (see
//! `schema`) and replace the placeholder the macro derives; their output
//! schema is [`Answer`]'s.

use rmcp::{
    RoleServer,
    handler::server::{router::tool::ToolRouter, wrapper::Json, wrapper::Parameters},
    model::{CallToolResult, JsonObject},
    service::RequestContext,
    tool, tool_router,
};

use crate::{
    McpServer,
    answer::Answer,
    endpoints::{self, Read, Write},
    schema::Documents,
};

/// What every tool answers: an [`Answer`], or a call that could not be made.
type Reply = Result<Json<Answer>, CallToolResult>;

const WRITE_RULE: &str = " Give `intent`: a stable name for this one action, the same on every retry \
     (after a timeout, an error or a restart). The answer's `outcome` says what happened and \
     `next_step` what to do: `done`; `poll get_operation`; `call again with the same intent`; \
     `wait for approval` (then call again with the same intent); `stop: new intent or human review`.";

#[tool_router]
impl McpServer {
    #[tool(
        description = "Open a ticket in a project. A `source_event_id` (the alert's id) makes the service answer `matched_existing` with the ticket that event already has.",
        annotations(
            title = "Create a ticket",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn create_ticket(&self, Parameters(args): Parameters<JsonObject>, ctx: RequestContext<RoleServer>) -> Reply {
        self.write("create_ticket", &endpoints::CREATE_TICKET, args, &ctx).await
    }

    #[tool(
        description = "Add a comment to a ticket. Each comment is its own action: its own intent.",
        annotations(
            title = "Comment on a ticket",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn comment_on_ticket(
        &self,
        Parameters(args): Parameters<JsonObject>,
        ctx: RequestContext<RoleServer>,
    ) -> Reply {
        self.write("comment_on_ticket", &endpoints::COMMENT_ON_TICKET, args, &ctx)
            .await
    }

    #[tool(
        description = "Declare a ticket's status (open, acknowledged, resolved, closed). Setting the status it has is `matched_existing`; a stale `expected_version` is refused.",
        annotations(
            title = "Set a ticket's status",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn set_ticket_status(
        &self,
        Parameters(args): Parameters<JsonObject>,
        ctx: RequestContext<RoleServer>,
    ) -> Reply {
        self.write("set_ticket_status", &endpoints::SET_TICKET_STATUS, args, &ctx)
            .await
    }

    #[tool(
        description = "Create a payment intent for an order (no money moves yet). Amounts are decimal strings with an ISO 4217 currency, e.g. \"12.50\" EUR. One live intent per order.",
        annotations(
            title = "Create a payment intent",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = true
        )
    )]
    async fn create_payment_intent(
        &self,
        Parameters(args): Parameters<JsonObject>,
        ctx: RequestContext<RoleServer>,
    ) -> Reply {
        self.write("create_payment_intent", &endpoints::CREATE_PAYMENT_INTENT, args, &ctx)
            .await
    }

    #[tool(
        description = "Capture a payment intent: moves money through the payment provider. Answers at once; the capture's end shows in get_operation or get_payment_intent.",
        annotations(
            title = "Capture a payment",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = true,
            open_world_hint = true
        )
    )]
    async fn capture_payment(
        &self,
        Parameters(args): Parameters<JsonObject>,
        ctx: RequestContext<RoleServer>,
    ) -> Reply {
        self.write("capture_payment", &endpoints::CAPTURE_PAYMENT, args, &ctx)
            .await
    }

    #[tool(
        description = "Refund part or all of a captured payment. Each refund is its own action: its own intent. Refunds never exceed what was captured.",
        annotations(
            title = "Refund a payment",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = true,
            open_world_hint = true
        )
    )]
    async fn refund_payment(&self, Parameters(args): Parameters<JsonObject>, ctx: RequestContext<RoleServer>) -> Reply {
        self.write("refund_payment", &endpoints::REFUND_PAYMENT, args, &ctx)
            .await
    }

    #[tool(
        description = "Cancel a payment intent that has not been captured.",
        annotations(
            title = "Cancel a payment intent",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = true,
            open_world_hint = true
        )
    )]
    async fn cancel_payment_intent(
        &self,
        Parameters(args): Parameters<JsonObject>,
        ctx: RequestContext<RoleServer>,
    ) -> Reply {
        self.write("cancel_payment_intent", &endpoints::CANCEL_PAYMENT_INTENT, args, &ctx)
            .await
    }

    #[tool(
        description = "Deploy an immutable artifact (`sha256:` digest, 40-hex commit) to an environment. One active deployment per service and environment; protected environments wait for a human's approval.",
        annotations(
            title = "Create a deployment",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = true
        )
    )]
    async fn create_deployment(
        &self,
        Parameters(args): Parameters<JsonObject>,
        ctx: RequestContext<RoleServer>,
    ) -> Reply {
        self.write("create_deployment", &endpoints::CREATE_DEPLOYMENT, args, &ctx)
            .await
    }

    #[tool(
        description = "Cancel a queued or running deployment.",
        annotations(
            title = "Cancel a deployment",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = true,
            open_world_hint = true
        )
    )]
    async fn cancel_deployment(
        &self,
        Parameters(args): Parameters<JsonObject>,
        ctx: RequestContext<RoleServer>,
    ) -> Reply {
        self.write("cancel_deployment", &endpoints::CANCEL_DEPLOYMENT, args, &ctx)
            .await
    }

    #[tool(
        description = "Roll a service in an environment back to an earlier deployment. Every rollback waits for a human's approval of this exact request.",
        annotations(
            title = "Create a rollback",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = true,
            open_world_hint = true
        )
    )]
    async fn create_rollback(
        &self,
        Parameters(args): Parameters<JsonObject>,
        ctx: RequestContext<RoleServer>,
    ) -> Reply {
        self.write("create_rollback", &endpoints::CREATE_ROLLBACK, args, &ctx)
            .await
    }

    #[tool(
        description = "Where an operation stands, by `operation_id`, `idempotency_key` or `intent` (exactly one). Its `state`: in_progress, awaiting_approval, completed, failed, unknown, rejected.",
        annotations(title = "Get an operation", read_only_hint = true, open_world_hint = false)
    )]
    async fn get_operation(&self, Parameters(args): Parameters<JsonObject>, ctx: RequestContext<RoleServer>) -> Reply {
        reply(self.gateway.get_operation(&self.session(&ctx), args).await)
    }

    #[tool(
        description = "A ticket by id.",
        annotations(title = "Get a ticket", read_only_hint = true, open_world_hint = false)
    )]
    async fn get_ticket(&self, Parameters(args): Parameters<JsonObject>, ctx: RequestContext<RoleServer>) -> Reply {
        self.read("get_ticket", &endpoints::GET_TICKET, args, &ctx).await
    }

    #[tool(
        description = "Tickets in creation order, by project, source_event_id or status; `next_cursor` pages on.",
        annotations(title = "List tickets", read_only_hint = true, open_world_hint = false)
    )]
    async fn list_tickets(&self, Parameters(args): Parameters<JsonObject>, ctx: RequestContext<RoleServer>) -> Reply {
        self.read("list_tickets", &endpoints::LIST_TICKETS, args, &ctx).await
    }

    #[tool(
        description = "A payment intent by id, with its state (requires_capture, processing, succeeded, failed, unknown, cancelled).",
        annotations(title = "Get a payment intent", read_only_hint = true, open_world_hint = true)
    )]
    async fn get_payment_intent(
        &self,
        Parameters(args): Parameters<JsonObject>,
        ctx: RequestContext<RoleServer>,
    ) -> Reply {
        self.read("get_payment_intent", &endpoints::GET_PAYMENT_INTENT, args, &ctx)
            .await
    }

    #[tool(
        description = "A deployment or rollback by id, with its state (queued, running, succeeded, failed, cancelled, unknown).",
        annotations(title = "Get a deployment", read_only_hint = true, open_world_hint = true)
    )]
    async fn get_deployment(&self, Parameters(args): Parameters<JsonObject>, ctx: RequestContext<RoleServer>) -> Reply {
        self.read("get_deployment", &endpoints::GET_DEPLOYMENT, args, &ctx)
            .await
    }

    #[tool(
        description = "A service's environment: what runs there now and what holds its lock.",
        annotations(title = "Get an environment", read_only_hint = true, open_world_hint = true)
    )]
    async fn get_environment(
        &self,
        Parameters(args): Parameters<JsonObject>,
        ctx: RequestContext<RoleServer>,
    ) -> Reply {
        self.read("get_environment", &endpoints::GET_ENVIRONMENT, args, &ctx)
            .await
    }

    #[tool(
        description = "An approval request by id: what it is for and whether a human decided.",
        annotations(title = "Get an approval", read_only_hint = true, open_world_hint = false)
    )]
    async fn get_approval(&self, Parameters(args): Parameters<JsonObject>, ctx: RequestContext<RoleServer>) -> Reply {
        reply(self.gateway.get_approval(&self.session(&ctx), args).await)
    }
}

fn reply(result: Result<Answer, crate::answer::ToolError>) -> Reply {
    result.map(Json).map_err(CallToolResult::from)
}

impl McpServer {
    async fn write(
        &self,
        tool: &'static str,
        endpoint: &Write,
        args: JsonObject,
        ctx: &RequestContext<RoleServer>,
    ) -> Reply {
        reply(self.gateway.write(&self.session(ctx), tool, endpoint, args).await)
    }

    async fn read(
        &self,
        tool: &'static str,
        endpoint: &Read,
        args: JsonObject,
        ctx: &RequestContext<RoleServer>,
    ) -> Reply {
        reply(self.gateway.read(&self.session(ctx), tool, endpoint, args).await)
    }

    /// The tools, with the input schemas of the services' documents and the
    /// retry rule in every write's description.
    pub(crate) fn tools(documents: &Documents) -> ToolRouter<McpServer> {
        let mut router = McpServer::tool_router();
        // every tool answers an Answer (the alias hides it from the macro)
        for route in router.map.values_mut() {
            route.attr.output_schema = Some(rmcp::handler::server::tool::schema_for_output::<Answer>());
        }
        for (name, endpoint) in endpoints::WRITES {
            let tool = &mut router.map.get_mut(name).expect("every write is a tool").attr;
            tool.input_schema = documents.write_input(&endpoint).into();
            let description = tool.description.as_deref().unwrap_or_default();
            tool.description = Some(format!("{description}{WRITE_RULE}").into());
        }
        for (name, endpoint) in endpoints::READS {
            router
                .map
                .get_mut(name)
                .expect("every read is a tool")
                .attr
                .input_schema = documents.read_input(&endpoint).into();
        }
        router.map.get_mut("get_operation").expect("a tool").attr.input_schema =
            crate::schema::get_operation_input().into();
        router.map.get_mut("get_approval").expect("a tool").attr.input_schema =
            crate::schema::get_approval_input().into();
        router
    }
}
