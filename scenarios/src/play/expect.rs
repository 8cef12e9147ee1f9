//! The story's last word: its expectations, read from the services' own records.

use std::time::Duration;

use super::{AGENT_KEY, APPROVER_KEY, Stage};
use crate::story::{CountExpect, Expectations};

impl Stage<'_> {
    /// The story's last word, read from the services' own records.
    pub(super) async fn expectations(&mut self, expect: &Expectations) -> Result<(), String> {
        // the outbox and the watcher may still be finishing what the story started
        tokio::time::sleep(Duration::from_millis(300)).await;
        if let Some(expected) = expect.tickets {
            let tickets = self
                .world
                .get(
                    &format!("{}/v1/tickets?limit=200", self.world.services["tickets"]),
                    AGENT_KEY,
                )
                .await?;
            let got = tickets["data"].as_array().map_or(0, Vec::len);
            self.check(
                "tickets in the tickets service".into(),
                expected.to_string(),
                got.to_string(),
                got == expected,
            );
        }
        let provider = self.world.provider.clone();
        let controller = self.world.controller.clone();
        for (expected, url, member, what) in [
            (
                expect.provider_charges,
                &provider,
                "charges_made",
                "charges the payment provider really made",
            ),
            (
                expect.provider_refunds,
                &provider,
                "refunds_made",
                "refunds the payment provider really made",
            ),
            (
                expect.controller_rollouts,
                &controller,
                "rollouts_started",
                "rollouts the deployment controller really started",
            ),
            (
                expect.controller_cancels,
                &controller,
                "rollouts_cancelled",
                "rollouts the deployment controller really stopped",
            ),
        ] {
            let Some(expected) = expected else { continue };
            let stats = self.world.get(&format!("{url}/admin/stats"), AGENT_KEY).await?;
            let got = stats[member].as_u64().unwrap_or(0);
            self.check(what.into(), expected.to_string(), got.to_string(), got == expected);
        }
        for count in &expect.count {
            self.count(count).await?;
        }
        if let Some(pending) = &expect.pending_approvals {
            let service = self.world.service(&pending.service)?;
            let approvals = self
                .world
                .get(
                    &format!("{}/v1/approvals?state=pending", self.world.services[service]),
                    APPROVER_KEY,
                )
                .await?;
            let got = approvals["data"].as_array().map_or(0, Vec::len);
            self.check(
                format!("approvals pending at {service}"),
                pending.count.to_string(),
                got.to_string(),
                got == pending.count,
            );
        }
        for spread in &expect.spread {
            let service = self.world.service(&spread.service)?;
            let key = self
                .known
                .get(&spread.operation)
                .map(|k| k.key.clone())
                .ok_or_else(|| format!("no operation `{}`", spread.operation))?;
            let mut reached: Vec<usize> = self.world.proxies[service]
                .passed()
                .iter()
                .filter(|p| p.idempotency_key.as_deref() == Some(key.as_str()))
                .filter_map(|p| p.replica)
                .collect();
            reached.sort_unstable();
            reached.dedup();
            self.check(
                format!("replicas of {service} that `{}`'s requests reached", spread.operation),
                spread.replicas.to_string(),
                reached.len().to_string(),
                reached.len() == spread.replicas,
            );
        }
        for journal in &expect.journal {
            let service = self.world.service(&journal.service)?;
            let operation_id = self
                .known
                .get(&journal.operation)
                .and_then(|k| k.operation_id.clone())
                .ok_or_else(|| format!("`{}` has no operation id", journal.operation))?;
            let entries = self
                .world
                .get(
                    &format!(
                        "{}/v1/audit?operation_id={operation_id}&limit=200",
                        self.world.services[service]
                    ),
                    APPROVER_KEY,
                )
                .await?;
            let events: Vec<String> = entries["data"]
                .as_array()
                .map(|entries| {
                    entries
                        .iter()
                        .filter_map(|e| e["event"].as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default();
            for event in &journal.includes {
                self.check(
                    format!("{service}'s journal of `{}` records `{event}`", journal.operation),
                    "present".into(),
                    events.join(", "),
                    events.contains(event),
                );
            }
            for event in &journal.excludes {
                self.check(
                    format!("{service}'s journal of `{}` has no `{event}`", journal.operation),
                    "absent".into(),
                    events.join(", "),
                    !events.contains(event),
                );
            }
        }
        Ok(())
    }

    /// Counts a list's items that match, as the API shows them.
    pub(super) async fn count(&mut self, count: &CountExpect) -> Result<(), String> {
        let service = self.world.service(&count.service)?;
        let url = format!("{}{}", self.world.services[service], self.fill_text(&count.path));
        let bearer = if count.as_approver { APPROVER_KEY } else { AGENT_KEY };
        let list = self.world.get(&url, bearer).await?;
        let items = list["data"]
            .as_array()
            .ok_or_else(|| format!("GET {url}: no `data` list in {list}"))?;
        let got = items
            .iter()
            .filter(|item| {
                count
                    .matching
                    .iter()
                    .all(|(member, value)| item[member.as_str()] == value.as_str())
            })
            .count();
        self.check(
            count.what.clone(),
            count.count.to_string(),
            got.to_string(),
            got == count.count,
        );
        Ok(())
    }
}
