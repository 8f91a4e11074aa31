//! Time as the services store it: integer milliseconds since the Unix epoch,
//! converted to `google.protobuf.Timestamp` at the wire.

/// Milliseconds since the Unix epoch, now.
pub fn now_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_millis() as i64)
        .unwrap_or_default()
}

/// A wire timestamp from milliseconds since the epoch.
pub fn to_timestamp(millis: i64) -> prost_types::Timestamp {
    prost_types::Timestamp { seconds: millis.div_euclid(1000), nanos: (millis.rem_euclid(1000) * 1_000_000) as i32 }
}

/// Milliseconds since the epoch from a wire timestamp.
pub fn from_timestamp(timestamp: &prost_types::Timestamp) -> i64 {
    timestamp.seconds.saturating_mul(1000).saturating_add(i64::from(timestamp.nanos / 1_000_000))
}
