//! Where a crash test can stop the process dead; nothing without the
//! `failpoints` feature.

/// With the `failpoints` feature and `FAILPOINTS=<name>=return`, whatever
/// reaches it (a request, the outbox worker, a chain round) holds what it has
/// until the process is killed (`FAILPOINTS` in docs/configuration.md).
pub async fn fail_point(name: &str) {
    #[cfg(feature = "failpoints")]
    {
        // read from `FAILPOINTS` once per process, wherever it started
        static FROM_ENV: std::sync::Once = std::sync::Once::new();
        FROM_ENV.call_once(|| std::mem::forget(fail::FailScenario::setup()));
    }
    #[cfg(feature = "failpoints")]
    if fail::eval(name, |_| ()).is_some() {
        tracing::warn!(
            fail_point = name,
            "fail point reached: holding here until the process is killed"
        );
        std::future::pending::<()>().await;
    }
    #[cfg(not(feature = "failpoints"))]
    let _ = name;
}
