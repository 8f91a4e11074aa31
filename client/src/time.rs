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

/// A wire duration from milliseconds.
pub fn to_duration(millis: u64) -> prost_types::Duration {
    let millis = i64::try_from(millis).unwrap_or(i64::MAX);
    prost_types::Duration { seconds: millis / 1000, nanos: ((millis % 1000) * 1_000_000) as i32 }
}

/// A wire duration from whole seconds.
pub fn seconds_to_duration(seconds: u64) -> prost_types::Duration {
    prost_types::Duration { seconds: i64::try_from(seconds).unwrap_or(i64::MAX), nanos: 0 }
}

/// Milliseconds of a wire duration (nanoseconds below a millisecond are
/// dropped); not set is zero. A negative or malformed duration is refused
/// with what is wrong with it.
pub fn from_duration(duration: Option<&prost_types::Duration>) -> Result<u64, String> {
    let Some(duration) = duration else { return Ok(0) };
    check_duration(duration)?;
    Ok((duration.seconds as u64).saturating_mul(1000).saturating_add((duration.nanos / 1_000_000) as u64))
}

/// Whole seconds of a wire duration; not set is zero. A negative or
/// malformed duration, or one with a fraction of a second, is refused.
pub fn duration_seconds(duration: Option<&prost_types::Duration>) -> Result<u64, String> {
    let Some(duration) = duration else { return Ok(0) };
    check_duration(duration)?;
    if duration.nanos != 0 {
        return Err(format!("must be whole seconds (it has {} ns more)", duration.nanos));
    }
    Ok(duration.seconds as u64)
}

fn check_duration(duration: &prost_types::Duration) -> Result<(), String> {
    if duration.seconds < 0 || duration.nanos < 0 {
        return Err("must not be negative".to_owned());
    }
    if duration.nanos >= 1_000_000_000 {
        return Err(format!("has {} nanoseconds; at most 999999999", duration.nanos));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_round_trip_and_refuse_what_is_not_one() {
        assert_eq!(from_duration(Some(&to_duration(1_234))), Ok(1_234));
        assert_eq!(from_duration(None), Ok(0));
        assert_eq!(duration_seconds(Some(&seconds_to_duration(86_400))), Ok(86_400));
        assert!(duration_seconds(Some(&to_duration(1_500))).unwrap_err().contains("whole seconds"));
        assert!(
            from_duration(Some(&prost_types::Duration { seconds: -1, nanos: 0 })).unwrap_err().contains("negative")
        );
        let malformed = prost_types::Duration { seconds: 1, nanos: 1_000_000_000 };
        assert!(from_duration(Some(&malformed)).unwrap_err().contains("999999999"));
    }
}
