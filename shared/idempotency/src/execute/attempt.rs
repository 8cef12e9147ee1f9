//! An attempt: one request that carries an idempotency key, and what it brings to its operation.

use std::{
    sync::{Mutex, PoisonError},
    time::Duration,
};

use platform::{ApiError, Principal, Timestamp, telemetry};
use serde::Serialize;

use crate::{
    fingerprint::Fingerprint,
    gate::Request,
    key::IdempotencyHeaders,
    operation::{OperationIdentity, new_operation_id},
    store::NewOperation,
    transitions::{AuditEvent, Record},
};

/// One request that carries an idempotency key: who sent it, to which route, whether it waits at the gate.
#[derive(Debug)]
pub struct Attempt<'a> {
    pub principal: &'a Principal,
    pub headers: IdempotencyHeaders,
    pub method: &'static str,
    /// The route *template*, e.g. `/v1/tickets/{ticket_id}/comments`.
    pub route: &'static str,
    /// `Some`: the operation waits at the layer's gate before it runs, which is asked with this.
    pub approval: Option<Box<dyn Request>>,
    /// When this attempt arrived: the time of its `attempted` journal entry.
    pub started: Timestamp,
    /// Taken as the attempt begins ([`Self::begin`]); empty until then, which matches no operation.
    pub(super) fingerprint: Fingerprint,
    /// The database outages this process had seen as the attempt began (0, the safe side, until
    /// then): what it learns is remembered only while no other is seen (docs/design.md §4).
    pub(super) outages_seen: u64,
    logged_operation: Mutex<Option<String>>,
}

impl<'a> Attempt<'a> {
    pub fn post(route: &'static str, principal: &'a Principal, headers: IdempotencyHeaders) -> Self {
        Attempt {
            principal,
            headers,
            method: "POST",
            route,
            approval: None,
            started: Timestamp::now(),
            fingerprint: Fingerprint::from_stored(String::new()),
            outages_seen: 0,
            logged_operation: Mutex::new(None),
        }
    }

    /// Takes the command's fingerprint; a command the fingerprint cannot hold exactly is a 400 that claims nothing.
    pub(super) fn begin(mut self, command: &impl Serialize, outages_seen: u64) -> Result<Self, ApiError> {
        self.fingerprint = Fingerprint::of(self.method, self.route, &self.principal.account_id, command)
            .map_err(|inexact| ApiError::invalid_field(&inexact.field, inexact.to_string()))?;
        self.outages_seen = outages_seen;
        Ok(self)
    }

    /// What the route's policy decided: `Some(request)` when the operation must wait at the layer's
    /// gate, asked with `request`. A layer with no gate, or one that does not know it, answers 500.
    pub fn approval(mut self, policy: Option<impl Request>) -> Self {
        self.approval = policy.map(|request| Box::new(request) as Box<dyn Request>);
        self
    }

    /// Names the operation on the request's log span once per operation: a waiting duplicate looks
    /// again at every poll, and the text log format appends a field each time it is recorded.
    pub(super) fn record_operation(&self, operation_id: &str) {
        let mut logged = self.logged_operation.lock().unwrap_or_else(PoisonError::into_inner);
        if logged.as_deref() != Some(operation_id) {
            telemetry::record_operation(operation_id, self.fingerprint.as_str());
            *logged = Some(operation_id.to_owned());
        }
    }

    /// This attempt's operation, called `operation_id`; its fingerprint is empty until [`Self::begin`].
    pub(super) fn identity<'b>(&'b self, operation_id: &'b str) -> OperationIdentity<'b> {
        OperationIdentity {
            account_id: &self.principal.account_id,
            operation_id,
            idempotency_key: self.headers.key.as_str(),
            fingerprint: self.fingerprint.as_str(),
            route: self.route,
        }
    }

    /// A journal record of this attempt about `operation_id`; one answered before it learned its
    /// operation names none.
    pub(super) fn audit(&self, event: AuditEvent, operation_id: Option<&str>, at: Timestamp) -> Record {
        let identity = self.identity(operation_id.unwrap_or_default());
        Record {
            operation_id: operation_id.map(str::to_owned),
            ..identity.audit(event, &self.principal.principal_id, None, at)
        }
    }

    pub(super) fn new_operation<'b>(&'b self, lease: Duration) -> NewOperation<'b> {
        let now = Timestamp::now();
        NewOperation {
            account_id: &self.principal.account_id,
            key: &self.headers.key,
            operation_id: new_operation_id(),
            principal_id: &self.principal.principal_id,
            method: self.method,
            route: self.route,
            fingerprint: &self.fingerprint,
            lease_token: new_lease_token(),
            locked_until: now.plus(lease),
            now,
        }
    }
}

pub(super) fn new_lease_token() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}
