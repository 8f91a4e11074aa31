//! Typed reads of mapping fields that report what is wrong where.

use super::diagnostic::{Diagnostics, child_path, index_path};
use super::formats::suggestion;
use super::yaml::{MERGE_KEY, Node, same_text};

/// Warns about keys that are not in `known` (with a suggestion) and reports
/// keys that are not strings.
pub(crate) fn check_keys(
    mapping: Node<'_>,
    path: &str,
    known: &[&str],
    unknown_code: &'static str,
    type_code: &'static str,
    what: &str,
    diagnostics: &mut Diagnostics,
) {
    for (key, value) in mapping.mapping().into_iter().flatten() {
        match key.as_str() {
            Some(name) if known.iter().any(|known| same_text(known, name)) => {}
            Some(MERGE_KEY) if value.is_merge_source() => {}
            Some(MERGE_KEY) => diagnostics.error(
                type_code,
                &child_path(path, MERGE_KEY),
                value.position(),
                format!(
                    "the merge key '<<' in {what} needs a mapping or a list of mappings, found {}",
                    value.type_name()
                ),
            ),
            Some(name) => diagnostics.warning(
                unknown_code,
                &child_path(path, name),
                key.position(),
                format!("unknown field '{name}' in {what}{}", suggestion(name, known)),
            ),
            None => diagnostics.error(
                type_code,
                path,
                key.position(),
                format!("keys of {what} must be strings, found {}", key.type_name()),
            ),
        }
    }
}

/// The string value of `key`, when present; an error when it is not a string.
pub(crate) fn string_field<'a>(
    mapping: Node<'a>,
    key: &str,
    path: &str,
    code: &'static str,
    diagnostics: &mut Diagnostics,
) -> Option<(Node<'a>, &'a str)> {
    let value = mapping.get(key)?;
    match value.as_str() {
        Some(text) => Some((value, text)),
        None => {
            diagnostics.error(
                code,
                &child_path(path, key),
                value.position(),
                format!("field '{key}' must be a string, found {}", value.type_name()),
            );
            None
        }
    }
}

/// A list of strings under `key`, when present; errors for a non-list and
/// for each entry that is not a string.
pub(crate) fn string_list_field<'a>(
    mapping: Node<'a>,
    key: &str,
    path: &str,
    code: &'static str,
    diagnostics: &mut Diagnostics,
) -> Option<Vec<(Node<'a>, &'a str)>> {
    let value = mapping.get(key)?;
    let Some(items) = value.sequence() else {
        diagnostics.error(
            code,
            &child_path(path, key),
            value.position(),
            format!("field '{key}' must be a list of strings, found {}", value.type_name()),
        );
        return None;
    };
    let mut strings = Vec::with_capacity(items.len());
    let mut all_strings = true;
    for (index, item) in items.enumerate() {
        match item.as_str() {
            Some(text) => strings.push((item, text)),
            None => {
                all_strings = false;
                diagnostics.error(
                    code,
                    &index_path(&child_path(path, key), index),
                    item.position(),
                    format!("entries of '{key}' must be strings, found {}", item.type_name()),
                );
            }
        }
    }
    all_strings.then_some(strings)
}

/// An integer under `key` within `low..=high`, when present.
pub(crate) fn integer_field(
    mapping: Node<'_>,
    key: &str,
    path: &str,
    (type_code, range_code): (&'static str, &'static str),
    (low, high): (i64, i64),
    diagnostics: &mut Diagnostics,
) -> Option<i64> {
    let value = mapping.get(key)?;
    match value.as_i64() {
        Some(number) if (low..=high).contains(&number) => Some(number),
        Some(number) => {
            diagnostics.error(
                range_code,
                &child_path(path, key),
                value.position(),
                format!("field '{key}' must be between {low} and {high}, found {number}"),
            );
            None
        }
        None => {
            diagnostics.error(
                type_code,
                &child_path(path, key),
                value.position(),
                format!("field '{key}' must be an integer, found {}", value.type_name()),
            );
            None
        }
    }
}

/// A boolean under `key`, when present.
pub(crate) fn bool_field(
    mapping: Node<'_>,
    key: &str,
    path: &str,
    code: &'static str,
    diagnostics: &mut Diagnostics,
) -> Option<bool> {
    let value = mapping.get(key)?;
    let flag = value.as_bool();
    if flag.is_none() {
        diagnostics.error(
            code,
            &child_path(path, key),
            value.position(),
            format!("field '{key}' must be true or false, found {}", value.type_name()),
        );
    }
    flag
}
