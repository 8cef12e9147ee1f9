//! The compose file is a way to run the sandbox's services in the production
//! shape (replicas behind a proxy), with the demo keys on, so it must not
//! publish them to a network: while any service runs with
//! `RETRYSAFE_SANDBOX`, every published port is on loopback — the proxy's
//! included, since it reaches the replicas that hold the keys.
//!
//! The file is read line by line (two-space indents, as it is written): no
//! YAML parser is worth a dependency for a check this small.

/// Each service of the compose file and the ports it publishes.
#[derive(Debug, Default)]
struct Service {
    name: String,
    ports: Vec<String>,
}

fn services(compose: &str) -> Vec<Service> {
    let mut services: Vec<Service> = Vec::new();
    let mut in_services = false;
    let mut in_ports = false;
    for line in compose.lines() {
        let indent = line.len() - line.trim_start().len();
        let text = line.trim();
        if text.is_empty() || text.starts_with('#') {
            continue;
        }
        match indent {
            0 => in_services = text == "services:",
            2 if in_services => {
                let name = text.split(':').next().unwrap_or(text);
                services.push(Service {
                    name: name.to_owned(),
                    ..Service::default()
                });
                in_ports = false;
            }
            4 if in_services => in_ports = text == "ports:",
            _ if in_services && in_ports => {
                if let (Some(service), Some(port)) = (services.last_mut(), text.strip_prefix("- ")) {
                    service.ports.push(port.trim_matches('"').to_owned());
                }
            }
            _ => {}
        }
    }
    services
}

/// Whether any service runs with the demo keys (set directly, or through a shared block).
fn runs_with_demo_keys(compose: &str) -> bool {
    compose
        .lines()
        .filter_map(|line| line.trim().strip_prefix("RETRYSAFE_SANDBOX:"))
        .any(|value| value.trim().trim_matches('"') == "true")
}

#[test]
fn with_the_demo_keys_on_the_compose_file_publishes_every_port_on_loopback_only() {
    let compose = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docker-compose.yml"))
        .expect("docker-compose.yml at the workspace root");

    let services = services(&compose);

    assert!(
        runs_with_demo_keys(&compose),
        "the compose file runs the sandbox's services"
    );
    let published: Vec<(&str, &str)> = services
        .iter()
        .flat_map(|s| s.ports.iter().map(|p| (s.name.as_str(), p.as_str())))
        .collect();
    assert!(
        published.iter().any(|(name, _)| *name == "proxy"),
        "the proxy publishes the services: {services:?}"
    );
    for (name, port) in published {
        assert!(
            port.starts_with("127.0.0.1:"),
            "{name} publishes {port} beyond loopback"
        );
    }
}

#[test]
fn a_port_published_on_every_interface_is_seen() {
    let compose = "services:\n  tickets:\n    ports:\n      - \"7001:7001\"\n    environment:\n      RETRYSAFE_SANDBOX: \"true\"\n";

    let services = services(compose);

    assert!(runs_with_demo_keys(compose));
    assert_eq!(services.len(), 1);
    assert_eq!(services[0].ports, vec!["7001:7001".to_owned()]);
}
