//! Console sessions: the browser holds an opaque random id, and only the
//! console knows which approver key it stands for.
//!
//! Cookies ignore ports, so every page on the console's host receives the
//! cookie: it must not be worth more than a bounded, revocable session.
//! Sessions live in this process's memory — a sandbox console serves a few
//! people, and a restart signs them out, which is the safe direction. So
//! does the bound on how many there are: past it, a sign-in ends the
//! session that has waited longest for a request.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use platform::auth::ApiKey;

/// How long a session lasts, and how many there are at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionLimits {
    /// Ended after this long without a request.
    pub idle: Duration,
    /// Ended this long after sign-in, however busy.
    pub absolute: Duration,
    /// Live at once, at most: one sign-in more ends the least recently used.
    pub max_live: usize,
}

impl Default for SessionLimits {
    fn default() -> Self {
        SessionLimits {
            idle: Duration::from_secs(30 * 60),
            absolute: Duration::from_secs(8 * 60 * 60),
            max_live: 1000,
        }
    }
}

/// What a live session gives a request: the approver's key, to act with,
/// and the token its forms must carry back.
#[derive(Debug, Clone)]
pub struct Session {
    pub key: ApiKey,
    pub form_token: String,
}

struct Entry {
    session: Session,
    started: Instant,
    last_seen: Instant,
}

/// The live sessions by id. A `std::sync::Mutex`: it is never held across an `.await`.
#[derive(Clone)]
pub struct Sessions {
    limits: SessionLimits,
    live: Arc<Mutex<HashMap<String, Entry>>>,
}

impl Sessions {
    pub fn new(limits: SessionLimits) -> Self {
        Sessions {
            limits,
            live: Arc::default(),
        }
    }

    pub fn limits(&self) -> SessionLimits {
        self.limits
    }

    /// A new session for a verified key; returns its id, the cookie's value.
    pub fn start(&self, key: ApiKey) -> String {
        let id = random_token();
        let now = Instant::now();
        let entry = Entry {
            session: Session {
                key,
                form_token: random_token(),
            },
            started: now,
            last_seen: now,
        };
        let mut live = self.live.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        // sign-ins are where sessions are made, so where the ended ones are swept
        live.retain(|_, entry| !self.has_ended(entry, now));
        while live.len() >= self.limits.max_live.max(1) {
            let Some(least_recent) = live
                .iter()
                .min_by_key(|(_, entry)| entry.last_seen)
                .map(|(id, _)| id.clone())
            else {
                break;
            };
            live.remove(&least_recent);
        }
        live.insert(id.clone(), entry);
        id
    }

    /// The session `id` names, if it is live; a request keeps it from idling out.
    pub fn find(&self, id: &str) -> Option<Session> {
        let now = Instant::now();
        let mut live = self.live.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let entry = live.get_mut(id)?;
        if self.has_ended(entry, now) {
            live.remove(id);
            return None;
        }
        entry.last_seen = now;
        Some(entry.session.clone())
    }

    /// Signs out: the id names nothing from now on.
    pub fn end(&self, id: &str) {
        self.live
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(id);
    }

    fn has_ended(&self, entry: &Entry, now: Instant) -> bool {
        now.duration_since(entry.last_seen) >= self.limits.idle
            || now.duration_since(entry.started) >= self.limits.absolute
    }
}

/// 244 random bits from the operating system's CSPRNG (two version-4 UUIDs), as hex.
fn random_token() -> String {
    format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(idle: u64, absolute: u64) -> SessionLimits {
        SessionLimits {
            idle: Duration::from_secs(idle),
            absolute: Duration::from_secs(absolute),
            ..SessionLimits::default()
        }
    }

    #[test]
    fn a_session_is_found_by_its_id_until_it_is_ended() {
        let sessions = Sessions::new(SessionLimits::default());
        let id = sessions.start(ApiKey::new("demo-acme-approver"));
        assert_eq!(id.len(), 64);
        assert_eq!(sessions.find(&id).unwrap().key.expose(), "demo-acme-approver");
        assert!(
            sessions.find("0".repeat(64).as_str()).is_none(),
            "a forged id names nothing"
        );
        sessions.end(&id);
        assert!(sessions.find(&id).is_none());
    }

    #[test]
    fn an_idle_or_old_session_has_ended() {
        for sessions in [Sessions::new(limits(0, 3600)), Sessions::new(limits(3600, 0))] {
            let id = sessions.start(ApiKey::new("demo-acme-approver"));
            assert!(sessions.find(&id).is_none());
        }
    }

    #[test]
    fn past_the_bound_a_sign_in_ends_the_least_recently_used_session() {
        let sessions = Sessions::new(SessionLimits {
            max_live: 3,
            ..SessionLimits::default()
        });
        let ids: Vec<String> = (0..3).map(|_| sessions.start(ApiKey::new("k"))).collect();
        // the first and the third are used again: the second has now waited longest
        assert!(sessions.find(&ids[0]).is_some());
        assert!(sessions.find(&ids[2]).is_some());

        let newest = sessions.start(ApiKey::new("k"));
        assert_eq!(sessions.live.lock().unwrap().len(), 3, "never more than the bound");
        assert!(sessions.find(&ids[1]).is_none(), "the least recently used one ended");
        for id in [&ids[0], &ids[2], &newest] {
            assert!(sessions.find(id).is_some());
        }
    }

    #[test]
    fn each_session_has_its_own_id_and_form_token() {
        let sessions = Sessions::new(SessionLimits::default());
        let (one, two) = (sessions.start(ApiKey::new("k")), sessions.start(ApiKey::new("k")));
        assert_ne!(one, two);
        assert_ne!(
            sessions.find(&one).unwrap().form_token,
            sessions.find(&two).unwrap().form_token
        );
    }
}
