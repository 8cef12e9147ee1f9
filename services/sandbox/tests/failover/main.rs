//! Past one database (docs/design.md §12): the services on a real primary
//! and its streaming standby, the primary killed with SIGKILL, the standby
//! promoted behind an address the test moves (a virtual IP, pgbouncer or
//! HAProxy in a real deployment).
//!
//! - `storm`: a synchronous standby under a storm of writes loses no
//!   acknowledged answer, with the kill at three moments;
//! - `lagging`: the article's hazard, told as a story: an asynchronous
//!   standby that lags loses acknowledged claims, and the retries make a
//!   second effect; a synchronous one does not.
//!
//! PostgreSQL only: each test starts its own primary and standby from the
//! machine's PostgreSQL programs, and is skipped where PostgreSQL is not
//! reachable or its programs are not installed (never under `CI=true`).

mod lagging;
mod storm;
mod world;
