//! The read tools: a GET of the endpoint at the service that has it.

use rmcp::model::JsonObject;
use serde_json::Value;

use super::{
    Gateway, Session,
    args::{fill_route, query_of},
};
use crate::{
    answer::{Answer, NextStep, Outcome, ToolError},
    calls::ToolCall,
    endpoints::{Read, Service},
};

fn unreachable_service(service: Service, error: &reqwest::Error) -> ToolError {
    let why = if error.is_timeout() {
        "did not answer in time"
    } else {
        "could not be reached"
    };
    ToolError::new(
        "service_unreachable",
        format!("{} {why}: try again later", service.as_str()),
    )
}

impl Gateway {
    /// A read tool: a GET of the endpoint with the arguments as its path and query.
    pub async fn read(
        &self,
        session: &Session,
        tool: &'static str,
        endpoint: &Read,
        mut args: JsonObject,
    ) -> Result<Answer, ToolError> {
        let mut call = ToolCall::new(session, tool);
        call.account = Some(self.agent(endpoint.service).journal().account().to_string());
        let result = async {
            let path = fill_route(endpoint.route, &mut args)?;
            let query = query_of(args, endpoint.query)?;
            self.get(endpoint.service, &path, &query).await
        }
        .await;
        self.record(call, &result).await;
        result
    }

    /// Asks `known` (or each service in turn) until one has it; a service
    /// that cannot be reached is passed over while another may answer.
    pub(super) async fn find(
        &self,
        known: Option<Service>,
        path: &str,
        query: &[(String, String)],
    ) -> Result<Answer, ToolError> {
        let services = match known {
            Some(service) => vec![service],
            None => Service::ALL.to_vec(),
        };
        let mut last = None;
        for service in services {
            let answer = self.get(service, path, query).await;
            let empty_list = answer
                .as_ref()
                .ok()
                .and_then(|a| a.resource.as_ref())
                .and_then(|r| r["data"].as_array())
                .is_some_and(Vec::is_empty);
            match answer {
                Ok(found) if found.outcome == Outcome::Found && !empty_list => return Ok(found),
                // an answer that found nothing beats a service that could not be asked
                Ok(answer) => last = Some(Ok(answer)),
                Err(error) if last.is_none() => last = Some(Err(error)),
                Err(_) => {}
            }
        }
        last.unwrap_or_else(|| Ok(Answer::not_found()))
    }

    async fn get(&self, service: Service, path: &str, query: &[(String, String)]) -> Result<Answer, ToolError> {
        let target = self.config.target(service);
        let response = self
            .http
            .get(format!("{}{path}", target.url))
            .bearer_auth(&target.api_key)
            .query(query)
            .send()
            .await
            .map_err(|e| unreachable_service(service, &e))?;
        let status = response.status().as_u16();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        let outcome = match status {
            200..=299 => Outcome::Found,
            404 => Outcome::NotFound,
            400..=499 => Outcome::Refused,
            _ => {
                return Err(ToolError::new(
                    "service_unreachable",
                    format!("{} answered {status}: try again later", service.as_str()),
                ));
            }
        };
        Ok(Answer {
            outcome,
            operation_id: None,
            idempotency_key: None,
            http_status: Some(status),
            resource: Some(body),
            next_step: if outcome == Outcome::Refused {
                NextStep::Stop
            } else {
                NextStep::Done
            },
            approval: None,
        })
    }
}
