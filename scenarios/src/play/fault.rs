//! A fault step: the network to a service, or an external system, told to
//! misbehave; or the services' database failed over.

use fault_proxy::ProxyFaults;

use super::Stage;
use crate::story::{DatabaseFault, Fault};

impl Stage<'_> {
    pub(super) async fn fault(&mut self, fault: &Fault) -> Result<(), String> {
        if let Some(database) = fault.database {
            self.database_fault(database).await?;
        }
        if let Some(network) = &fault.network {
            let service = self.world.service(&network.service)?;
            self.world.proxies[service].set_faults(ProxyFaults {
                drop_next_answers: network.drop_next_answers,
                fail_next: network.fail_next,
                delay_ms: network.delay_ms,
            });
            self.note(
                "story",
                &format!(
                    "fault on the network to {service}: drop_next_answers {}, fail_next {}, delay_ms {}",
                    network.drop_next_answers, network.fail_next, network.delay_ms
                ),
            );
        }
        let external = match &fault.external {
            None => (None, None),
            Some(external) if external.system == "payment provider" => (Some(&external.faults), None),
            Some(external) if external.system == "deployment controller" => (None, Some(&external.faults)),
            Some(external) => {
                return Err(format!(
                    "no external system `{}`: payment provider or deployment controller",
                    external.system
                ));
            }
        };
        for (system, url, faults) in [
            (
                "payment provider",
                self.world.provider.clone(),
                fault.provider.as_ref().or(external.0),
            ),
            (
                "deployment controller",
                self.world.controller.clone(),
                fault.controller.as_ref().or(external.1),
            ),
        ] {
            let Some(faults) = faults else { continue };
            let answer = self
                .world
                .http()
                .put(format!("{url}/admin/faults"))
                .json(faults)
                .send()
                .await
                .map_err(|e| e.to_string())?;
            if !answer.status().is_success() {
                return Err(format!("the {system} refused the faults: {}", answer.status()));
            }
            self.note("story", &format!("fault at the {system}: {faults}"));
        }
        Ok(())
    }
}

impl Stage<'_> {
    async fn database_fault(&mut self, fault: DatabaseFault) -> Result<(), String> {
        let standby = self
            .world
            .standby
            .as_ref()
            .ok_or("a database fault needs a standby: `[sandbox] standby = \"asynchronous\"`")?;
        match fault {
            DatabaseFault::StandbyFallsBehind => {
                standby.fall_behind().await?;
                self.note(
                    "database",
                    "the standby has caught up; its replication is cut: from now on the primary alone has what is written",
                );
            }
            DatabaseFault::PrimaryDies => {
                standby.fail_over().await?;
                self.note(
                    "database",
                    "the primary is killed (SIGKILL); the standby is promoted; the services' database address now reaches it",
                );
            }
        }
        Ok(())
    }
}
