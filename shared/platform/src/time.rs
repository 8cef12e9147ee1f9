//! One timestamp type for responses and both databases.
//!
//! Times are made in the service and truncated to microseconds, the
//! precision PostgreSQL keeps, so a value read back equals the one that went
//! into the first answer. SQLite stores them as fixed-width RFC 3339 text, so
//! that comparing two of them as text compares them as times.
//!
//! # Whose clock
//!
//! [`Timestamp::now`] is the **database server's** time, as this process last
//! measured it ([`Db::sync_clock`](crate::Db::sync_clock)): replicas on one
//! PostgreSQL server then agree on when a lease or a retention period ends,
//! whatever their own clocks say. The offset is measured at start-up and
//! every minute. It is one offset for the whole process: a process with
//! only SQLite databases keeps its own clock (SQLite runs in it), and one
//! that also has a PostgreSQL database (the sandbox on mixed URLs, a test
//! binary) puts them all on that server's clock.

use std::{
    fmt,
    sync::atomic::{AtomicI64, Ordering},
};

use chrono::{DateTime, SecondsFormat, SubsecRound, Utc};
use serde::{Deserialize, Serialize};
use sqlx::{
    Decode, Encode, Postgres, Sqlite, Type,
    encode::IsNull,
    error::BoxDynError,
    postgres::{PgArgumentBuffer, PgTypeInfo, PgValueRef},
    sqlite::{SqliteArgumentsBuffer, SqliteTypeInfo, SqliteValueRef},
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Timestamp(#[serde(with = "rfc3339_micros")] DateTime<Utc>);

/// The database server's clock minus this process's, in microseconds.
static DATABASE_OFFSET_MICROS: AtomicI64 = AtomicI64::new(0);

/// This process's clock, as the database's offset is measured against.
pub(crate) fn local_now() -> DateTime<Utc> {
    let now = Utc::now();
    #[cfg(feature = "failpoints")]
    let now = now + local_skew();
    now
}

/// A test's wrong clock: `FAILPOINTS_CLOCK_SKEW_SECONDS` moves this
/// process's clock, as a replica whose clock is off would have it. A value
/// that is not a number stops the process: a test must not pass unskewed.
#[cfg(feature = "failpoints")]
fn local_skew() -> chrono::Duration {
    static SKEW: std::sync::OnceLock<chrono::Duration> = std::sync::OnceLock::new();
    *SKEW.get_or_init(|| {
        let seconds: f64 = std::env::var("FAILPOINTS_CLOCK_SKEW_SECONDS").ok().map_or(0.0, |s| {
            s.parse().expect("FAILPOINTS_CLOCK_SKEW_SECONDS is a number of seconds")
        });
        chrono::Duration::microseconds((seconds * 1e6) as i64)
    })
}

/// Sets how far the database server's clock is from this process's.
pub(crate) fn set_database_offset(offset: chrono::Duration) {
    let micros = offset.num_microseconds().unwrap_or(0);
    DATABASE_OFFSET_MICROS.store(micros, Ordering::Relaxed);
}

impl Timestamp {
    /// Now, by the database server's clock (see the module's doc).
    pub fn now() -> Self {
        let offset = chrono::Duration::microseconds(DATABASE_OFFSET_MICROS.load(Ordering::Relaxed));
        Timestamp((local_now() + offset).trunc_subsecs(6))
    }

    pub fn from_datetime(at: DateTime<Utc>) -> Self {
        Timestamp(at.trunc_subsecs(6))
    }

    pub fn as_datetime(&self) -> DateTime<Utc> {
        self.0
    }

    pub fn plus(self, duration: std::time::Duration) -> Self {
        let delta = chrono::Duration::from_std(duration).unwrap_or(chrono::Duration::MAX);
        Timestamp::from_datetime(self.0.checked_add_signed(delta).unwrap_or(DateTime::<Utc>::MAX_UTC))
    }

    pub fn minus(self, duration: std::time::Duration) -> Self {
        let delta = chrono::Duration::from_std(duration).unwrap_or(chrono::Duration::MAX);
        Timestamp::from_datetime(self.0.checked_sub_signed(delta).unwrap_or(DateTime::<Utc>::MIN_UTC))
    }

    /// Whole seconds from now until `self`, at least zero.
    pub fn seconds_from_now(self) -> u64 {
        (self.0 - Timestamp::now().0).num_seconds().max(0) as u64
    }

    /// `2026-12-02T14:25:10.123456Z`: always six fraction digits.
    pub fn to_rfc3339(&self) -> String {
        self.0.to_rfc3339_opts(SecondsFormat::Micros, true)
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_rfc3339())
    }
}

mod rfc3339_micros {
    use chrono::{DateTime, SecondsFormat, Utc};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(at: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&at.to_rfc3339_opts(SecondsFormat::Micros, true))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DateTime<Utc>, D::Error> {
        let text = String::deserialize(d)?;
        DateTime::parse_from_rfc3339(&text)
            .map(|at| at.with_timezone(&Utc))
            .map_err(serde::de::Error::custom)
    }
}

impl utoipa::PartialSchema for Timestamp {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .format(Some(utoipa::openapi::SchemaFormat::KnownFormat(
                utoipa::openapi::KnownFormat::DateTime,
            )))
            .examples(["2026-12-02T14:25:10.123456Z"])
            .into()
    }
}

impl utoipa::ToSchema for Timestamp {}

impl Type<Postgres> for Timestamp {
    fn type_info() -> PgTypeInfo {
        <DateTime<Utc> as Type<Postgres>>::type_info()
    }
}

impl Encode<'_, Postgres> for Timestamp {
    fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
        <DateTime<Utc> as Encode<Postgres>>::encode_by_ref(&self.0, buf)
    }
}

impl<'r> Decode<'r, Postgres> for Timestamp {
    fn decode(value: PgValueRef<'r>) -> Result<Self, BoxDynError> {
        Ok(Timestamp(<DateTime<Utc> as Decode<Postgres>>::decode(value)?))
    }
}

impl Type<Sqlite> for Timestamp {
    fn type_info() -> SqliteTypeInfo {
        <String as Type<Sqlite>>::type_info()
    }

    fn compatible(ty: &SqliteTypeInfo) -> bool {
        <String as Type<Sqlite>>::compatible(ty)
    }
}

impl Encode<'_, Sqlite> for Timestamp {
    fn encode_by_ref(&self, buf: &mut SqliteArgumentsBuffer) -> Result<IsNull, BoxDynError> {
        <String as Encode<Sqlite>>::encode(self.to_rfc3339(), buf)
    }
}

impl<'r> Decode<'r, Sqlite> for Timestamp {
    fn decode(value: SqliteValueRef<'r>) -> Result<Self, BoxDynError> {
        let text = <String as Decode<Sqlite>>::decode(value)?;
        Ok(Timestamp(DateTime::parse_from_rfc3339(&text)?.with_timezone(&Utc)))
    }
}
