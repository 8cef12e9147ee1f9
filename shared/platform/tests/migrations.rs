//! A service database takes the migrations of several components (platform,
//! idempotency, the service's own) into one `_sqlx_migrations` table keyed by
//! version: two migrations with one version would refuse to run together.

use std::{collections::BTreeMap, path::Path};

#[test]
fn no_two_migrations_of_any_component_share_a_version() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../migrations");
    for backend in ["sqlite", "postgres"] {
        let mut seen: BTreeMap<String, String> = BTreeMap::new();
        for component in std::fs::read_dir(&root).expect("the migrations folder") {
            let Ok(files) = std::fs::read_dir(component.expect("a component").path().join(backend)) else {
                continue;
            };
            for file in files {
                let path = file.expect("a migration").path().display().to_string();
                let name = path.rsplit('/').next().unwrap_or_default();
                let version = name.split('_').next().unwrap_or_default().to_owned();
                if let Some(other) = seen.insert(version.clone(), path.clone()) {
                    panic!("{path} and {other} share version {version}");
                }
            }
        }
        assert!(seen.len() >= 5, "{backend}: found only {} migrations", seen.len());
    }
}
