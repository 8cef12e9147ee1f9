//! What the process tests share: the `deployments` binary started as a real
//! process, and the simulated controller it hands rollouts to.

use std::time::Duration;

use platform::testing::ServiceProcess;

/// A `deployments` process on `database_url`, its outbox worker held at
/// `fail_point` if one is given (until the test kills it).
pub async fn start(database_url: &str, controller_url: &str, fail_point: Option<&str>) -> ServiceProcess {
    let fail_point = fail_point.map(|point| format!("{point}=return"));
    let mut env = vec![
        ("DEPLOYMENTS_DATABASE_URL", database_url),
        ("DEPLOYMENTS_CONTROLLER_URL", controller_url),
        // a held event is free again after 2 s
        ("RETRYSAFE_OUTBOX_LEASE_SECONDS", "2"),
        ("RETRYSAFE_OUTBOX_TIMEOUT_SECONDS", "1"),
        ("RETRYSAFE_RECONCILE_AFTER_SECONDS", "0.2"),
    ];
    env.extend(fail_point.as_deref().map(|point| ("FAILPOINTS", point)));
    ServiceProcess::start(env!("CARGO_BIN_EXE_deployments"), "deployments", &env).await
}

/// The simulated controller, in the test process: it is the external system,
/// not what dies. Each rollout moves a step every `step`.
pub async fn controller(step: Duration) -> (deploy_controller::Controller, String) {
    let controller = deploy_controller::Controller::open(deploy_controller::ControllerConfig {
        step,
        ..Default::default()
    })
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(deploy_controller::serve(
        listener,
        controller.clone(),
        Default::default(),
        std::future::pending(),
    ));
    (controller, url)
}
