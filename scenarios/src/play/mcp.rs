//! An MCP step: a client calls one of the server's tools.

use std::time::Duration;

use serde_json::Value;

use super::{Known, Stage};
use crate::story::{McpCall, StepExpect};

impl Stage<'_> {
    /// An MCP client calls a tool: to its end, or until the server is killed
    /// or the client goes away, as the step says.
    pub(super) async fn mcp(&mut self, call: &McpCall, expect: Option<&StepExpect>) -> Result<(), String> {
        use rmcp::{ServiceExt, model::CallToolRequestParams, transport::StreamableHttpClientTransport};

        self.world.start_mcp().await?;
        let arguments = match self.fill(&call.arguments) {
            Value::Object(arguments) => arguments,
            _ => return Err("an MCP call's arguments are an object".into()),
        };
        let intent = arguments
            .get("intent")
            .and_then(Value::as_str)
            .unwrap_or("-")
            .to_owned();
        let client =
            ().serve(StreamableHttpClientTransport::from_uri(self.world.mcp_url.as_str()))
                .await
                .map_err(|e| format!("the MCP client could not connect: {e}"))?;
        self.note("agent", &format!("MCP tools/call {} (intent `{intent}`)", call.tool));
        let request = CallToolRequestParams::new(call.tool.clone()).with_arguments(arguments);
        let calling = client.call_tool(request);
        let result = match (call.kill_server_after_ms, call.end_session_after_ms) {
            (Some(ms), _) => {
                tokio::select! {
                    result = calling => Some(result),
                    () = tokio::time::sleep(Duration::from_millis(ms)) => None,
                }
            }
            (None, Some(ms)) => tokio::time::timeout(Duration::from_millis(ms), calling).await.ok(),
            (None, None) => Some(calling.await),
        };
        let interrupted = call.kill_server_after_ms.or(call.end_session_after_ms).is_some();
        if interrupted && result.is_some() {
            // the step's fault never happened: what follows would prove nothing
            self.check(
                format!("the MCP call `{intent}` is still waiting when it is interrupted"),
                "no answer yet".into(),
                "it had been answered".into(),
                false,
            );
        }
        let Some(result) = result else {
            if call.kill_server_after_ms.is_some() {
                self.world.kill_mcp().await;
                self.note("story", "the MCP server is killed (SIGKILL) while the call waits");
            } else {
                drop(client);
                self.note("agent", "the MCP session ends in the middle of the call");
            }
            return Ok(());
        };
        drop(client);
        let result = result.map_err(|e| format!("tools/call {}: {e}", call.tool))?;
        let is_error = result.is_error == Some(true);
        let answer = match (&result.structured_content, is_error) {
            (Some(structured), false) => structured.clone(),
            _ => result
                .content
                .iter()
                .find_map(|c| c.as_text().and_then(|t| serde_json::from_str(&t.text).ok()))
                .unwrap_or(Value::Null),
        };
        let outcome = if is_error {
            "tool_error"
        } else {
            answer["outcome"].as_str().unwrap_or("-")
        };
        self.note(
            "agent",
            &format!(
                "MCP answer: {outcome}{}",
                answer["next_step"]
                    .as_str()
                    .map(|s| format!(" · next: {s}"))
                    .unwrap_or_default()
            ),
        );
        let key = answer["idempotency_key"].as_str().map(str::to_owned);
        if let Some(key) = &key {
            self.known.insert(
                intent.clone(),
                Known {
                    key: key.clone(),
                    operation_id: answer["operation_id"].as_str().map(str::to_owned),
                    body: answer["resource"].clone(),
                },
            );
        }
        let code = if is_error {
            answer["code"].as_str()
        } else {
            answer["resource"]["code"].as_str()
        };
        self.check_outcome(&intent, expect, outcome, code, key.as_deref());
        Ok(())
    }
}
