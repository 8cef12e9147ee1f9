//! The payments service (CONTRACT §7 Payments), being built (issue 4): so
//! far the money it takes — amount strings turned into integer minor units
//! before anything else sees them ([`money`]). Intents, captures through the
//! outbox, refunds and the reconciler follow, on the simulated provider in
//! `services/payment-provider`.

pub mod money;
