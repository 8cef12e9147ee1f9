//! The timeline: every party's record of what happened, merged in time order.

use agent::AgentConfig;

use super::{AGENT_KEY, APPROVER_KEY, Event, Stage};
use crate::world::SERVICES;

impl Stage<'_> {
    /// Every party's record, merged in time order: the story, the agents,
    /// the network, each service's audit journal, the provider, the controller.
    pub(super) async fn timeline(&mut self) -> Vec<Event> {
        let mut events = std::mem::take(&mut self.notes);
        for journal in self.journals.clone() {
            if let Ok(agent) = self.open_agent(&journal, AgentConfig::default()).await {
                for attempt in agent.journal().attempts(None).await.unwrap_or_default() {
                    let status = attempt.status.map(|s| format!(" {s}")).unwrap_or_default();
                    events.push(Event {
                        at: attempt.at,
                        lane: if journal == "main" {
                            "agent".into()
                        } else {
                            format!("agent ({journal})")
                        },
                        text: format!("{} · {}{status} · {}", attempt.name, attempt.action, attempt.note),
                    });
                }
                agent.journal().close().await;
            }
        }
        for call in self.world.mcp_calls().await {
            let text = |member: &str| call[member].as_str().unwrap_or("-").to_owned();
            events.push(Event {
                at: text("at"),
                lane: "mcp server".into(),
                text: format!(
                    "{} · intent {} · {} · key {} · {}",
                    text("tool"),
                    text("intent"),
                    text("outcome"),
                    text("idempotency_key"),
                    text("operation_id")
                ),
            });
        }
        for service in SERVICES {
            for passed in self.world.proxies[service].passed() {
                events.push(Event {
                    at: passed.at,
                    lane: format!("network → {service}"),
                    text: format!(
                        "{} {} key {} · {}{}",
                        passed.method,
                        passed.path,
                        passed.idempotency_key.as_deref().unwrap_or("-"),
                        passed.fate,
                        passed.status.map(|s| format!(" ({s})")).unwrap_or_default()
                    ),
                });
            }
            let url = format!("{}/v1/audit?limit=200", self.world.services[service]);
            if let Ok(entries) = self.world.get(&url, APPROVER_KEY).await {
                for entry in entries["data"].as_array().into_iter().flatten() {
                    events.push(Event {
                        at: entry["at"].as_str().unwrap_or_default().to_owned(),
                        lane: service.into(),
                        text: format!(
                            "{} · {} · key {} · by {}{}",
                            entry["event"].as_str().unwrap_or("-"),
                            entry["operation_id"].as_str().unwrap_or("-"),
                            entry["idempotency_key"].as_str().unwrap_or("-"),
                            entry["principal_id"].as_str().unwrap_or("-"),
                            entry["external_ref"]
                                .as_str()
                                .map(|r| format!(" · {r}"))
                                .unwrap_or_default()
                        ),
                    });
                }
            }
        }
        for (lane, url) in [
            ("payment provider", self.world.provider.clone()),
            ("deployment controller", self.world.controller.clone()),
        ] {
            if let Ok(list) = self.world.get(&format!("{url}/admin/events"), AGENT_KEY).await {
                for event in list.as_array().into_iter().flatten() {
                    events.push(Event {
                        at: event["at"].as_str().unwrap_or_default().to_owned(),
                        lane: lane.into(),
                        text: format!(
                            "{}{}",
                            event["what"].as_str().unwrap_or("-"),
                            event["key"].as_str().map(|k| format!(" · key {k}")).unwrap_or_default()
                        ),
                    });
                }
            }
        }
        events.sort_by(|a, b| a.at.cmp(&b.at));
        events
    }
}
