//! The other services' writes: a payment intent and a deployment, measured
//! beside the tickets create.

use platform::Backend;
use tokio::runtime::Runtime;

use crate::{
    db::{analyze, empty_db},
    load::{Load, Sample, median_figure},
    plan::Plan,
    report::OtherWrite,
    service::{Service, config, serve_router},
};

/// A payment intent, idempotent vs layer off; a deployment (claim, record and
/// outbox event in one transaction; nothing delivers the events here) vs the
/// tickets create.
pub async fn other_writes(
    backend: Backend,
    plan: &Plan,
    services: &Runtime,
    load: &Load,
    concurrency: usize,
    tickets: &Service,
) -> Vec<OtherWrite> {
    fn intent(n: u64) -> String {
        format!(
            r#"{{"order_id":"order-{n}","amount":"12.50","currency":"EUR","payee":{{"name":"Acme","account":"DE89370400440532013000"}}}}"#
        )
    }
    fn deployment(n: u64) -> String {
        format!(
            r#"{{"service":"svc-{n}","environment":"staging","artifact_digest":"sha256:{}"}}"#,
            "a".repeat(64)
        )
    }
    let (pay_on_db, pay_off_db, dep_db) = (
        empty_db(backend, "payments_on").await,
        empty_db(backend, "payments_off").await,
        empty_db(backend, "deployments").await,
    );
    for db in [&pay_on_db, &pay_off_db] {
        payments::migrate(db).await.expect("payments migrations apply");
    }
    deployments::migrate(&dep_db)
        .await
        .expect("deployments migrations apply");
    let (pay_on_app, pay_off_app) = (
        payments::App::new(pay_on_db.clone(), config(true), true, Default::default()),
        payments::App::new(pay_off_db.clone(), config(false), true, Default::default()),
    );
    let dep_app = deployments::App::new(dep_db.clone(), config(true), true, Default::default());
    let (pay_on, stop_on) = serve_router(
        services,
        payments::build_router(pay_on_app.clone()),
        &pay_on_app.idempotency,
    );
    let (pay_off, stop_off) = serve_router(
        services,
        payments::build_router(pay_off_app.clone()),
        &pay_off_app.idempotency,
    );
    let (dep, stop_dep) = serve_router(
        services,
        deployments::build_router(dep_app.clone()),
        &dep_app.idempotency,
    );
    let mut writes = Vec::new();
    eprintln!("payment intents, idempotent vs layer off, {concurrency} clients");
    let (on, off) = load
        .side_by_side(
            plan.rounds,
            concurrency,
            &load.writes(pay_on, "/v1/payment_intents", "pi-on", intent, |r| r.status == 201),
            &load.writes(pay_off, "/v1/payment_intents", "pi-off", intent, |r| r.status == 201),
        )
        .await;
    writes.push(other_write(
        "payment intent, idempotent",
        "payment intent, layer off",
        concurrency,
        &on,
        &off,
    ));
    eprintln!("deployments (with their outbox event) vs ticket creates, {concurrency} clients");
    let deployments = load.writes(dep, "/v1/deployments", "dep", deployment, |r| r.status == 202);
    // the table given rows and analyzed first, as it is within a service's first minute
    load.run(concurrency, &deployments).await;
    analyze(&dep_db).await;
    let (deployed, created) = load
        .side_by_side(
            plan.rounds,
            concurrency,
            &deployments,
            &load.creates(tickets.addr, "vs-deployments"),
        )
        .await;
    writes.push(other_write(
        "deployment + outbox event",
        "ticket create, idempotent",
        concurrency,
        &deployed,
        &created,
    ));
    for stop in [stop_on, stop_off, stop_dep] {
        let _ = stop.send(());
    }
    for db in [pay_on_db, pay_off_db, dep_db] {
        db.close().await;
    }
    writes
}

pub fn other_write(
    name: &str,
    baseline_name: &str,
    concurrency: usize,
    write: &[Sample],
    baseline: &[Sample],
) -> OtherWrite {
    let (write, baseline) = (median_figure(write), median_figure(baseline));
    OtherWrite {
        name: name.into(),
        baseline_name: baseline_name.into(),
        concurrency,
        write,
        baseline,
        throughput_ratio: write.rps / baseline.rps,
        p50_ratio: write.p50_ms / baseline.p50_ms,
    }
}
