//! Pages of lists read whole from memory or from a query, bounded by count
//! and by encoded size, so that no answer grows with what it lists; and the
//! check of a page token that names a position by key.

/// One page of `items`, which are sorted by `key`: those after
/// `page_token` (a key), at most `page_size` of them, ending early once
/// about `max_bytes` are encoded (always at least one); with the token of
/// the next page, empty on the last.
pub fn page<T, M: prost::Message>(
    items: &[T],
    key: impl Fn(&T) -> &str,
    to_wire: impl Fn(&T) -> M,
    page_size: usize,
    page_token: &str,
    max_bytes: usize,
) -> (Vec<M>, String) {
    let first = if page_token.is_empty() { 0 } else { items.partition_point(|item| key(item) <= page_token) };
    let rest = &items[first..];
    let mut page = Vec::new();
    let mut bytes = 0;
    for item in rest.iter().take(page_size.max(1)) {
        let wire = to_wire(item);
        bytes += wire.encoded_len();
        page.push(wire);
        if bytes >= max_bytes {
            break;
        }
    }
    let next_page_token = if rest.len() > page.len() { key(&rest[page.len() - 1]).to_owned() } else { String::new() };
    (page, next_page_token)
}

/// Most bytes of a key a page token names.
pub const MAX_KEY_TOKEN_BYTES: usize = 256;

/// Whether `page_token` can be a key-position token this service gave: empty,
/// or at most [`MAX_KEY_TOKEN_BYTES`] of the characters names are made of
/// (letters, digits, `_ - . : /`). Lists keyed by a name (agents, teams,
/// roles, processes, tools, schedules, budgets) refuse any other token with
/// INVALID_ARGUMENT naming `page_token`; a well-formed key only says where
/// the next page starts, which tells a caller nothing it may not list.
pub fn is_key_token(page_token: &str) -> bool {
    page_token.len() <= MAX_KEY_TOKEN_BYTES
        && page_token.bytes().all(|byte| byte.is_ascii_alphanumeric() || b"_-.:/".contains(&byte))
}

/// What a list answers a malformed page token with.
pub const MALFORMED_TOKEN: &str = "page_token is not one this service gave";

#[cfg(test)]
mod tests {
    use super::*;

    fn names(count: usize) -> Vec<String> {
        (0..count).map(|index| format!("n{index:03}")).collect()
    }

    #[test]
    fn pages_follow_one_another_by_count_and_by_size() {
        let items = names(25);
        let wire = |name: &String| name.clone();
        let (first, token) = page(&items, |name| name, wire, 10, "", usize::MAX);
        assert_eq!((first.len(), token.as_str()), (10, "n009"));
        let (second, token) = page(&items, |name| name, wire, 10, &token, usize::MAX);
        assert_eq!((second[0].as_str(), token.as_str()), ("n010", "n019"));
        let (last, token) = page(&items, |name| name, wire, 10, &token, usize::MAX);
        assert_eq!((last.len(), token.as_str()), (5, ""));
        // Each name encodes to 6 bytes: 20 bytes end a page after the fourth.
        let (small, token) = page(&items, |name| name, wire, 10, "", 20);
        assert_eq!((small.len(), token.as_str()), (4, "n003"));
        let (empty, token) = page(&items, |name| name, wire, 10, "zzz", usize::MAX);
        assert!(empty.is_empty() && token.is_empty());
    }

    #[test]
    fn key_tokens_are_names_and_nothing_else() {
        for good in ["", "n009", "agent:writer-agent", "role-delivery", "PythonDeveloper", "a.b/c_d"] {
            assert!(is_key_token(good), "{good}");
        }
        for bad in ["a b", "x\u{0}", "'; DROP", "%%%", &"x".repeat(MAX_KEY_TOKEN_BYTES + 1), "é"] {
            assert!(!is_key_token(bad), "{bad}");
        }
    }
}
