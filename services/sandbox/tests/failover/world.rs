//! What the failover tests share: the two services on a replicated pair,
//! behind a forwarder the test moves, and the writes agents send them.

use std::time::Duration;

use idempotency::IdempotencyConfig;
use outbox::OutboxConfig;
use platform::{
    Db,
    testing::{ACME_AGENT, TcpForwarder, TestClient, TestResponse, standby::ReplicatedPair},
};
use serde_json::{Value, json};

/// One write an agent means to make once: where, under which key, with what.
#[derive(Clone)]
pub struct Write {
    pub service: Service,
    pub path: String,
    pub bearer: &'static str,
    pub key: String,
    pub body: Value,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Service {
    Tickets,
    Payments,
}

/// The two services on the replicated pair, through the address the test moves.
pub struct Services {
    pub tickets: TestClient,
    pub payments: TestClient,
    pub provider: payment_provider::Provider,
    /// The two layers, for their journals.
    pub layers: [idempotency::Idempotency; 2],
    pub database: TcpForwarder,
    _background: Vec<idempotency::Background>,
}

impl Services {
    pub async fn start(pair: &ReplicatedPair) -> Services {
        let database = TcpForwarder::start(pair.primary).await;
        let tickets_db = Db::connect(&ReplicatedPair::url(database.addr, "tickets"), 8)
            .await
            .unwrap();
        let payments_db = Db::connect(&ReplicatedPair::url(database.addr, "payments"), 8)
            .await
            .unwrap();
        tickets::migrate(&tickets_db).await.expect("tickets migrations apply");
        payments::migrate(&payments_db)
            .await
            .expect("payments migrations apply");

        let provider = payment_provider::Provider::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let provider_url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(payment_provider::serve(
            listener,
            provider.clone(),
            Default::default(),
            std::future::pending(),
        ));

        let tickets = tickets::App::new(tickets_db, IdempotencyConfig::default(), true);
        let payments = payments::App::new(
            payments_db,
            IdempotencyConfig::default(),
            true,
            payments::provider::ProviderConfig {
                url: provider_url,
                merchant_key: payments::provider::SANDBOX_MERCHANT_KEY.to_owned(),
            },
        );
        let outbox = OutboxConfig {
            delivery_timeout: Duration::from_secs(1),
            lease: Duration::from_secs(2),
            reconcile_after: Duration::from_millis(200),
            ..OutboxConfig::default()
        };
        let background = vec![
            tickets.idempotency.spawn_background(),
            payments
                .idempotency
                .spawn_background()
                .with(payments.outbox(outbox).spawn()),
        ];
        Services {
            layers: [tickets.idempotency.clone(), payments.idempotency.clone()],
            tickets: TestClient::new(tickets::build_router(tickets)),
            payments: TestClient::new(payments::build_router(payments)),
            provider,
            database,
            _background: background,
        }
    }

    pub fn client(&self, service: Service) -> &TestClient {
        match service {
            Service::Tickets => &self.tickets,
            Service::Payments => &self.payments,
        }
    }

    pub async fn send(&self, write: &Write) -> TestResponse {
        self.client(write.service)
            .post(&write.path, write.bearer, Some(&write.key), &write.body)
            .await
    }

    /// Sends `write` until it is answered with anything but a 503 (within a minute).
    pub async fn answered(&self, write: &Write) -> TestResponse {
        for _ in 0..600 {
            let answer = self.send(write).await;
            if answer.status != 503 {
                return answer;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("`{}` was never answered", write.key);
    }

    /// A payment intent of 40 EUR for `order`, made under `bearer`; its id.
    pub async fn intent(&self, bearer: &str, order: &str) -> String {
        let body = json!({"order_id": order, "amount": "40.00", "currency": "EUR",
                          "payee": {"name": "Acme Supplies GmbH", "account": "DE89370400440532013000"}});
        let created = self
            .payments
            .post("/v1/payment_intents", bearer, Some(&format!("intent-{order}")), &body)
            .await;
        assert_eq!(created.status, 201, "{}", String::from_utf8_lossy(&created.body));
        created.str("id")
    }

    /// The provider's charges once they reach `expected` (or a minute
    /// passes), and half a second more for any beyond it.
    pub async fn charges_settled_at(&self, expected: u64) -> u64 {
        let _ = tokio::time::timeout(Duration::from_secs(60), async {
            while self.provider.stats().charges_made < expected {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        self.provider.stats().charges_made
    }

    /// The provider once it was asked to charge or refund `expected` times
    /// (or a minute passes), and half a second more for any beyond it.
    pub async fn provider_asked_at(&self, expected: u64) {
        let _ = tokio::time::timeout(Duration::from_secs(60), async {
            while self.provider.stats().requests < expected {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    /// The capture `capture_id` once it has left `processing` (or a minute passes).
    pub async fn capture_ended(&self, capture_id: &str) -> Value {
        let path = format!("/v1/captures/{capture_id}");
        for _ in 0..600 {
            let capture = self.payments.get(&path, ACME_AGENT).await.json();
            if capture["state"] != "processing" {
                return capture;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.payments.get(&path, ACME_AGENT).await.json()
    }

    /// Each service's journal verifies, and holds each operation's completion once.
    pub async fn journals_verify(&self) {
        for layer in &self.layers {
            layer.flush_journal().await;
            let entries = journal::all_entries(layer.db()).await.expect("the journal reads");
            journal::verify(&entries, None).expect("the journal verifies");
            let mut completed: Vec<&str> = entries
                .iter()
                .filter(|e| e.event == journal::AuditEvent::Completed)
                .filter_map(|e| e.operation_id.as_deref())
                .collect();
            let total = completed.len();
            completed.sort_unstable();
            completed.dedup();
            assert_eq!(completed.len(), total, "no operation completed twice");
        }
    }
}
