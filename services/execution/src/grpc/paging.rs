//! Pages of the list calls: the page size asked for, within bounds, and the
//! page tokens this service gives, checked when they come back.

use crate::{Error, Result};

/// Rows of a list page when the caller does not say, and at most.
const DEFAULT_PAGE: u32 = 100;
const MAX_PAGE: u32 = 1000;

/// The page size asked for, within bounds.
pub(super) fn page_size(asked: u32) -> u32 {
    if asked == 0 { DEFAULT_PAGE } else { asked.min(MAX_PAGE) }
}

/// A page token that names a position by key (a name): refused when it is
/// not one this service could have given.
pub(super) fn key_token(page_token: &str) -> Result<()> {
    if muster_runtime::paging::is_key_token(page_token) {
        Ok(())
    } else {
        Err(Error::invalid("page_token", muster_runtime::paging::MALFORMED_TOKEN))
    }
}

/// Where a page that this service ends with `<time>/<id>` goes on from;
/// `None` for the first page.
pub(super) fn time_and_id(page_token: &str) -> Result<Option<(i64, String)>> {
    if page_token.is_empty() {
        return Ok(None);
    }
    let token_error = || Error::invalid("page_token", "page_token is not one this service gave");
    let (time, id) = page_token.split_once('/').ok_or_else(token_error)?;
    Ok(Some((time.parse::<i64>().map_err(|_| token_error())?, id.to_owned())))
}
