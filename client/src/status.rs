//! The statuses a client builds itself (a request it refuses to send), as
//! the servers build them, and the bounds every muster status keeps to.
//! The rest of the convention, and the table of codes and details, is
//! `muster-runtime`'s `status`.

use tonic_types::{ErrorDetails, StatusExt as _};

/// INVALID_ARGUMENT about one field of the request: `message` (which names
/// the field for people), and a `google.rpc.BadRequest` whose violation
/// names it for programs (`budget.name`, `agents[3].id`).
pub fn invalid_field(field: &str, message: &str) -> tonic::Status {
    let message = truncate(message, MAX_MESSAGE_BYTES);
    let details = ErrorDetails::with_bad_request_violation(truncate(field, 256), message.as_ref());
    tonic::Status::with_error_details(tonic::Code::InvalidArgument, message, details)
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
