//! The compose file is a way to run the sandbox, so it must not publish the
//! demo keys to a network: a service started with `RETRYSAFE_SANDBOX` is
//! published on loopback only.
//!
//! The file is read line by line (two-space indents, as it is written): no
//! YAML parser is worth a dependency for a check this small.

/// Each service of the compose file: its name, whether it runs with the demo
/// keys, and the ports it publishes.
#[derive(Debug, Default)]
struct Service {
    name: String,
    sandbox: bool,
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
                services.push(Service {
                    name: text.trim_end_matches(':').to_owned(),
                    ..Service::default()
                });
                in_ports = false;
            }
            4 if in_services => in_ports = text == "ports:",
            _ if in_services => {
                let Some(service) = services.last_mut() else { continue };
                if in_ports && let Some(port) = text.strip_prefix("- ") {
                    service.ports.push(port.trim_matches('"').to_owned());
                }
                if let Some(value) = text.strip_prefix("RETRYSAFE_SANDBOX:") {
                    service.sandbox = value.trim().trim_matches('"') == "true";
                }
            }
            _ => {}
        }
    }
    services
}

#[test]
fn the_compose_file_publishes_a_service_with_the_demo_keys_on_loopback_only() {
    let compose = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docker-compose.yml"))
        .expect("docker-compose.yml at the workspace root");

    let services = services(&compose);

    let with_demo_keys: Vec<&Service> = services.iter().filter(|s| s.sandbox).collect();
    assert!(
        !with_demo_keys.is_empty(),
        "the compose file runs a sandbox service: {services:?}"
    );
    for service in with_demo_keys {
        for port in &service.ports {
            assert!(
                port.starts_with("127.0.0.1:"),
                "{} runs with the demo keys and publishes {port} beyond loopback",
                service.name
            );
        }
    }
}

#[test]
fn a_port_published_on_every_interface_is_seen() {
    let compose = "services:\n  tickets:\n    ports:\n      - \"7001:7001\"\n    environment:\n      RETRYSAFE_SANDBOX: \"true\"\n";

    let services = services(compose);

    assert_eq!(services.len(), 1);
    assert!(services[0].sandbox);
    assert_eq!(services[0].ports, vec!["7001:7001".to_owned()]);
}
