//! A fast reader for the block YAML that processes are written in: block
//! mappings and sequences, plain and quoted one-line scalars, one-line flow
//! collections and comments. It feeds the same [`Builder`] as the full parser,
//! with the same positions, so the tree and its diagnostics are the same
//! whichever reads the document. Anything outside that subset (anchors,
//! aliases, tags, block scalars, multi-line scalars or flows, directives,
//! tabs, several documents, unusual escapes, and every syntax error) it
//! declines, and the full parser reads the document from the start.

use std::borrow::Cow;

use super::builder::Builder;
use crate::diagnostic::Position;

/// The document is not in the subset this reader takes; the full parser
/// reads it instead.
#[derive(Debug)]
pub(super) struct Decline;

type Step<T = ()> = Result<T, Decline>;

/// A mapping key: its text, whether it is plain, and where its `:` is.
type Key<'s> = (Cow<'s, str>, bool, usize);

/// Longest key taken, from its start to its `:` (YAML allows 1,024
/// characters; the full parser judges anything near that).
const MAX_KEY_BYTES: usize = 1000;

/// Reads `source` into `builder`, or declines (leaving `builder` to be
/// cleared). A limit the builder reports also declines: the full parser
/// reports it with the same diagnostic.
pub(super) fn read(source: &str, builder: &mut Builder<'_>) -> Step {
    if !plain_text(source) {
        return Err(Decline);
    }
    let mut reader = Reader {
        bytes: source.as_bytes(),
        source,
        ascii: source.is_ascii(),
        builder,
        line: 0,
        start: 0,
        end: 0,
        indent: 0,
    };
    reader.next_line_from(0, 1)?;
    if reader.at_end() {
        return Err(Decline);
    }
    reader.builder.document_start(Position { line: 1, column: 1 }).map_err(|_| Decline)?;
    let at = reader.start + reader.indent;
    reader.node(at)?;
    if reader.at_end() { Ok(()) } else { Err(Decline) }
}

/// No byte order mark, tab, carriage return or other control character, and
/// only characters YAML accepts as printable.
fn plain_text(source: &str) -> bool {
    let bytes_ok = source.bytes().all(|byte| byte == b'\n' || (0x20..0x7f).contains(&byte) || byte >= 0x80);
    bytes_ok && (source.is_ascii() || source.chars().all(|character| character.is_ascii() || printable(character)))
}

/// A non-ASCII character YAML prints as it is: not a C1 control, a line or
/// paragraph separator, a byte order mark or a non-character.
fn printable(character: char) -> bool {
    matches!(
        character,
        '\u{a0}'..='\u{2027}' | '\u{202a}'..='\u{d7ff}' | '\u{e000}'..='\u{fefe}' | '\u{ff00}'..='\u{fffd}'
    ) || character >= '\u{10000}'
}

struct Reader<'s, 'b, 'l> {
    source: &'s str,
    bytes: &'s [u8],
    /// Columns count characters; in ASCII text, bytes.
    ascii: bool,
    builder: &'b mut Builder<'l>,
    /// The current content line: its number (from 1), where it starts and
    /// ends (at its `\n` or the end of the text), and its indentation.
    line: usize,
    start: usize,
    end: usize,
    indent: usize,
}

impl<'s> Reader<'s, '_, '_> {
    fn at_end(&self) -> bool {
        self.start >= self.bytes.len()
    }

    fn byte(&self, at: usize) -> u8 {
        if at < self.end { self.bytes[at] } else { b'\n' }
    }

    /// Moves to the first line from `from` (numbered `line`) with content,
    /// past blank and comment lines; at the end of the text, `at_end()`.
    fn next_line_from(&mut self, mut from: usize, mut line: usize) -> Step {
        while from < self.bytes.len() {
            let end = memchr(b'\n', &self.bytes[from..]).map_or(self.bytes.len(), |offset| from + offset);
            let indent = self.bytes[from..end].iter().take_while(|byte| **byte == b' ').count();
            let content = &self.bytes[from + indent..end];
            if !content.is_empty() && content[0] != b'#' {
                // Document markers and directives are for the full parser.
                if indent == 0
                    && (content[0] == b'%'
                        || ((content.starts_with(b"---") || content.starts_with(b"..."))
                            && content.get(3).is_none_or(|byte| *byte == b' ')))
                {
                    return Err(Decline);
                }
                (self.line, self.start, self.end, self.indent) = (line, from, end, indent);
                return Ok(());
            }
            from = end + 1;
            line += 1;
        }
        (self.line, self.start, self.end, self.indent) = (line, self.bytes.len(), self.bytes.len(), 0);
        Ok(())
    }

    fn next_line(&mut self) -> Step {
        self.next_line_from(self.end + 1, self.line + 1)
    }

    fn position(&self, at: usize) -> Position {
        Position {
            line: u32::try_from(self.line).unwrap_or(u32::MAX),
            column: u32::try_from(self.column(at) + 1).unwrap_or(u32::MAX),
        }
    }

    /// The column (in characters, from 0) of `at` on the current line.
    fn column(&self, at: usize) -> usize {
        if self.ascii {
            return at - self.start;
        }
        self.source.get(self.start..at).map_or(0, |prefix| prefix.chars().count())
    }

    fn skip_spaces(&self, mut at: usize) -> usize {
        while self.byte(at) == b' ' {
            at += 1;
        }
        at
    }

    /// After a node on the current line: only spaces and a comment may
    /// follow; then moves to the next content line.
    fn finish_line(&mut self, at: usize) -> Step {
        let rest = self.skip_spaces(at);
        if rest < self.end && (self.bytes[rest] != b'#' || rest == at) {
            return Err(Decline);
        }
        self.next_line()
    }

    /// True when nothing but spaces and a comment follows `at`.
    fn rest_is_empty(&self, at: usize) -> bool {
        let rest = self.skip_spaces(at);
        rest >= self.end || (self.bytes[rest] == b'#' && rest > at)
    }

    fn emit_scalar(&mut self, text: &str, plain: bool, at: usize) -> Step {
        let position = self.position(at);
        self.builder.scalar(text, plain, 0, position).map_err(|_| Decline)
    }

    fn emit_null(&mut self, position: Position) -> Step {
        self.builder.scalar("", true, 0, position).map_err(|_| Decline)
    }

    fn open(&mut self, is_mapping: bool, position: Position) -> Step {
        self.builder.open(is_mapping, 0, position).map_err(|_| Decline)
    }

    fn close(&mut self) -> Step {
        self.builder.close().map_err(|_| Decline)
    }

    /// A block node starting at `at` on the current line (its first
    /// character). Returns at the first content line after the node.
    fn node(&mut self, at: usize) -> Step {
        let column = self.column(at);
        if self.is_entry(at) {
            let position = self.position(at);
            self.open(false, position)?;
            self.items(at, column)?;
            return self.close();
        }
        if matches!(self.bytes[at], b'[' | b'{') {
            return self.inline_value(at);
        }
        match self.key(at)? {
            Some(key) => self.mapping(at, column, key),
            None => self.inline_value(at),
        }
    }

    /// Whether a sequence entry (`- `, or `-` ending its line) starts at `at`.
    fn is_entry(&self, at: usize) -> bool {
        self.bytes[at] == b'-' && matches!(self.byte(at + 1), b' ' | b'\n')
    }

    /// A value written on the line from `at` (a flow collection or a
    /// scalar), then the rest of the line.
    fn inline_value(&mut self, at: usize) -> Step {
        let after = if matches!(self.bytes[at], b'[' | b'{') { self.flow(at)? } else { self.value(at)? };
        self.finish_line(after)
    }

    /// A block mapping whose first key, `key`, is at `at`, every key at
    /// `indent`.
    fn mapping(&mut self, mut at: usize, indent: usize, mut key: Key<'s>) -> Step {
        let position = self.position(at);
        self.open(true, position)?;
        loop {
            let (text, plain, colon) = key;
            self.emit_scalar(&text, plain, at)?;
            if self.rest_is_empty(colon + 1) {
                let null = self.position(colon);
                self.next_line()?;
                if self.at_end() || self.indent < indent {
                    self.emit_null(null)?;
                } else if self.indent == indent {
                    if self.is_entry(self.start + self.indent) {
                        self.indentless_sequence(indent)?;
                    } else {
                        self.emit_null(null)?;
                    }
                } else {
                    self.node(self.start + self.indent)?;
                }
            } else {
                self.inline_value(self.skip_spaces(colon + 1))?;
            }
            if self.at_end() || self.indent < indent {
                break;
            }
            if self.indent > indent {
                return Err(Decline);
            }
            at = self.start + self.indent;
            if self.is_entry(at) {
                return Err(Decline);
            }
            key = self.key(at)?.ok_or(Decline)?;
        }
        self.close()
    }

    /// A sequence as a mapping's value, its `-` at the mapping's own
    /// indentation: it starts where its first item does.
    fn indentless_sequence(&mut self, indent: usize) -> Step {
        let dash = self.start + self.indent;
        let content = self.skip_spaces(dash + 1);
        if self.rest_is_empty(dash + 1) {
            return Err(Decline);
        }
        let position = self.position(content);
        self.open(false, position)?;
        self.items(dash, indent)?;
        self.close()
    }

    /// The items of a sequence, from its first `-` at `dash` (column
    /// `indent`) until a line that is not an item at that indentation.
    fn items(&mut self, mut dash: usize, indent: usize) -> Step {
        loop {
            let content = self.skip_spaces(dash + 1);
            if self.rest_is_empty(dash + 1) {
                let null = self.position(self.end);
                self.next_line()?;
                if self.at_end() || self.indent <= indent {
                    self.emit_null(null)?;
                } else {
                    self.node(self.start + self.indent)?;
                }
            } else {
                self.node(content)?;
            }
            if self.at_end() || self.indent < indent {
                return Ok(());
            }
            if self.indent > indent {
                return Err(Decline);
            }
            dash = self.start + self.indent;
            if !self.is_entry(dash) {
                return Ok(());
            }
        }
    }

    /// When a mapping key starts at `at`: its text, whether it is plain, and
    /// where its `:` is. `None` when the line holds a value, not a key.
    fn key(&self, at: usize) -> Step<Option<Key<'s>>> {
        let (text, plain, after) = match self.bytes[at] {
            b'\'' | b'"' => {
                let (text, after) = self.quoted(at)?;
                let colon = self.skip_spaces(after);
                if self.byte(colon) != b':' {
                    return Ok(None);
                }
                (text, false, colon)
            }
            _ => {
                self.plain_start(at)?;
                let mut index = at;
                let mut flow_indicator = false;
                loop {
                    match self.byte(index) {
                        b'\n' => return Ok(None),
                        b'#' if self.bytes[index - 1] == b' ' => return Ok(None),
                        b':' if matches!(self.byte(index + 1), b' ' | b'\n') => break,
                        b'[' | b']' | b'{' | b'}' | b',' => flow_indicator = true,
                        _ => {}
                    }
                    index += 1;
                }
                if flow_indicator {
                    return Err(Decline);
                }
                let text = self.source[at..index].trim_end_matches(' ');
                (Cow::Borrowed(text), true, index)
            }
        };
        if !matches!(self.byte(after + 1), b' ' | b'\n') || after - at > MAX_KEY_BYTES {
            return Err(Decline);
        }
        Ok(Some((text, plain, after)))
    }

    /// Declines a plain scalar that would start with an indicator.
    fn plain_start(&self, at: usize) -> Step {
        match self.bytes[at] {
            b'-' if !matches!(self.byte(at + 1), b' ' | b'\n' | b',' | b'[' | b']' | b'{' | b'}') => Ok(()),
            b'-' | b'?' | b':' | b',' | b'[' | b']' | b'{' | b'}' | b'#' | b'&' | b'*' | b'!' | b'|' | b'>' | b'\''
            | b'"' | b'%' | b'@' | b'`' | b'\\' => Err(Decline),
            _ => Ok(()),
        }
    }

    /// A scalar value in block context at `at`, emitted; returns where it ends.
    fn value(&mut self, at: usize) -> Step<usize> {
        if matches!(self.bytes[at], b'\'' | b'"') {
            let (text, after) = self.quoted(at)?;
            self.emit_scalar(&text, false, at)?;
            return Ok(after);
        }
        self.plain_start(at)?;
        let mut index = at;
        loop {
            match self.byte(index) {
                b'\n' => break,
                b'#' if self.bytes[index - 1] == b' ' => break,
                b':' if matches!(self.byte(index + 1), b' ' | b'\n') => return Err(Decline),
                _ => index += 1,
            }
        }
        let text = self.source[at..index].trim_end_matches(' ');
        let end = at + text.len();
        self.emit_scalar(text, true, at)?;
        Ok(end)
    }

    /// A flow sequence or mapping on one line, from its bracket at `at`;
    /// returns where it ends.
    fn flow(&mut self, at: usize) -> Step<usize> {
        let is_mapping = self.bytes[at] == b'{';
        let closing = if is_mapping { b'}' } else { b']' };
        let position = self.position(at);
        self.open(is_mapping, position)?;
        let mut index = self.skip_spaces(at + 1);
        if self.byte(index) == closing {
            self.close()?;
            return Ok(index + 1);
        }
        loop {
            if is_mapping {
                let (text, plain, after) = self.flow_scalar(index)?;
                if self.byte(after) != b':' || self.byte(after + 1) != b' ' {
                    return Err(Decline);
                }
                self.emit_scalar(&text, plain, index)?;
                index = self.skip_spaces(after + 1);
            }
            index = match self.byte(index) {
                b'[' | b'{' => self.flow(index)?,
                _ => {
                    let (text, plain, after) = self.flow_scalar(index)?;
                    self.emit_scalar(&text, plain, index)?;
                    after
                }
            };
            index = self.skip_spaces(index);
            match self.byte(index) {
                b',' => {
                    index = self.skip_spaces(index + 1);
                    if matches!(self.byte(index), b']' | b'}') {
                        return Err(Decline);
                    }
                }
                byte if byte == closing => {
                    self.close()?;
                    return Ok(index + 1);
                }
                _ => return Err(Decline),
            }
        }
    }

    /// A scalar inside a flow collection: its text, whether it is plain, and
    /// where it ends (before any spaces that follow it).
    fn flow_scalar(&self, at: usize) -> Step<(Cow<'s, str>, bool, usize)> {
        if matches!(self.byte(at), b'\'' | b'"') {
            let (text, after) = self.quoted(at)?;
            return Ok((text, false, after));
        }
        if self.byte(at) == b'\n' {
            return Err(Decline);
        }
        self.plain_start(at)?;
        let mut index = at;
        loop {
            match self.byte(index) {
                b'\n' => return Err(Decline),
                b',' | b']' | b'}' => break,
                b'#' if self.bytes[index - 1] == b' ' => return Err(Decline),
                b':' if matches!(self.byte(index + 1), b' ' | b'\n' | b',' | b']' | b'}') => break,
                b':' | b'[' | b'{' => return Err(Decline),
                _ => index += 1,
            }
        }
        let text = self.source[at..index].trim_end_matches(' ');
        Ok((Cow::Borrowed(text), true, at + text.len()))
    }

    /// A quoted scalar on one line, from its quote at `at`: its text and
    /// where it ends (after the closing quote).
    fn quoted(&self, at: usize) -> Step<(Cow<'s, str>, usize)> {
        let quote = self.bytes[at];
        let body = at + 1;
        let mut index = body;
        let mut owned: Option<String> = None;
        let mut copied = body;
        loop {
            let byte = self.byte(index);
            match byte {
                b'\n' => return Err(Decline),
                b'\'' if quote == b'\'' => {
                    if self.byte(index + 1) != b'\'' {
                        break;
                    }
                    let text = owned.get_or_insert_with(String::new);
                    text.push_str(&self.source[copied..=index]);
                    index += 2;
                    copied = index;
                }
                b'"' if quote == b'"' => break,
                b'\\' if quote == b'"' => {
                    let (character, length) = self.escape(index)?;
                    let text = owned.get_or_insert_with(String::new);
                    text.push_str(&self.source[copied..index]);
                    text.push(character);
                    index += length;
                    copied = index;
                }
                _ => index += 1,
            }
        }
        let text = match owned {
            Some(mut text) => {
                text.push_str(&self.source[copied..index]);
                Cow::Owned(text)
            }
            None => Cow::Borrowed(&self.source[body..index]),
        };
        Ok((text, index + 1))
    }

    /// The escape at `at` (its backslash) in a double-quoted scalar, and its
    /// length in bytes. Only the common escapes; others decline.
    fn escape(&self, at: usize) -> Step<(char, usize)> {
        let character = match self.byte(at + 1) {
            b'\\' => '\\',
            b'"' => '"',
            b'/' => '/',
            b'n' => '\n',
            b't' => '\t',
            b'r' => '\r',
            b'0' => '\0',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'e' => '\u{1b}',
            b'a' => '\u{7}',
            b'v' => '\u{b}',
            b'u' => {
                let digits = self.source.get(at + 2..at + 6).ok_or(Decline)?;
                if !digits.bytes().all(|byte| byte.is_ascii_hexdigit()) {
                    return Err(Decline);
                }
                let code = u32::from_str_radix(digits, 16).map_err(|_| Decline)?;
                return char::from_u32(code).map(|character| (character, 6)).ok_or(Decline);
            }
            _ => return Err(Decline),
        };
        Ok((character, 2))
    }
}

fn memchr(needle: u8, haystack: &[u8]) -> Option<usize> {
    haystack.iter().position(|byte| *byte == needle)
}

#[cfg(test)]
mod tests;
