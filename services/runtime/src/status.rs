//! The convention by which service errors become gRPC statuses.
//!
//! Each service has one `Error` type and one explicit `From<Error> for
//! tonic::Status` table. Client mistakes carry a precise message; internal
//! faults are logged here with their details and reach the client only as an
//! opaque message with a reference to find the log line.

use std::fmt::Display;

/// An INTERNAL status for a fault whose details must not reach the client.
pub fn internal(error: &dyn Display) -> tonic::Status {
    let reference = uuid_like_reference();
    tracing::error!(%error, reference, "internal error");
    tonic::Status::internal(format!("internal error (reference {reference}); see the service log"))
}

/// An UNAVAILABLE status for a dependency that cannot be reached now.
pub fn unavailable(what: &str, error: &dyn Display) -> tonic::Status {
    tracing::warn!(%error, dependency = what, "dependency unavailable");
    tonic::Status::unavailable(format!("{what} is unavailable; try again"))
}

/// RESOURCE_EXHAUSTED for a quota used up, with a `google.rpc.QuotaFailure`
/// detail naming what it is about (`subject`, such as `process:review`) and
/// the limit (`description`), and a `google.rpc.RetryInfo` when it is known
/// when to try again.
pub fn quota_exhausted(
    message: &str,
    subject: &str,
    description: &str,
    retry_after: Option<std::time::Duration>,
) -> tonic::Status {
    use tonic_types::{ErrorDetails, StatusExt as _};
    let mut details = ErrorDetails::with_quota_failure_violation(subject, description);
    if let Some(delay) = retry_after {
        details.set_retry_info(Some(delay));
    }
    tonic::Status::with_error_details(tonic::Code::ResourceExhausted, truncate(message, MAX_MESSAGE_BYTES), details)
}

fn uuid_like_reference() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_nanos() as u64)
        .unwrap_or_default();
    format!("{:x}-{:x}", nanos, COUNTER.fetch_add(1, Ordering::Relaxed))
}

/// Most bytes of a status message. With [`MAX_DETAILS_BYTES`] of details
/// (base64 in trailers, and percent-encoding that can triple a message) a
/// status stays well inside the 16 KiB of trailers that gRPC clients accept.
pub const MAX_MESSAGE_BYTES: usize = 1024;

/// Most bytes of a status's encoded details.
pub const MAX_DETAILS_BYTES: usize = 8 * 1024;

/// `text` cut to at most `max` bytes on a character boundary, ending with
/// how many bytes were left out.
pub fn truncate(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if text.len() <= max {
        return text.into();
    }
    // Room for the note, which is at most 30 bytes.
    let mut end = max.saturating_sub(30);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} more bytes)", &text[..end], text.len() - end).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_keeps_short_text_and_cuts_long_text_on_a_character() {
        assert_eq!(truncate("short", 10), "short");
        let long = "é".repeat(1000);
        let cut = truncate(&long, 100);
        assert!(cut.len() <= 100, "{}", cut.len());
        assert!(cut.ends_with("… (1930 more bytes)"), "{cut}");
    }
}
