//! YAML with positions: the one place that knows the YAML parser (STYLE rule
//! 14). [`parse`] builds a small node tree in an arena where every node keeps
//! its line and column: the block YAML processes are usually written in is
//! read by a fast reader of its own (`fast`), anything else from
//! `saphyr-parser` events, into the same tree with the same positions. An
//! alias is a reference to the anchored node, never a copy, and every node
//! knows its expanded size, so a "billion laughs" document is refused while
//! it is read, in memory proportional to its text. Every limit answers with a diagnostic.

mod builder;
mod fast;
mod parse;
mod scalar;

pub(crate) use parse::parse;

use super::diagnostic::{Diagnostic, Position};

/// Bounds that keep hostile documents cheap to refuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest document accepted, in bytes.
    pub max_document_bytes: usize,
    /// Deepest nesting of sequences and mappings.
    pub max_depth: usize,
    /// Longest scalar, in bytes.
    pub max_string_bytes: usize,
    /// Most nodes in the document as written (aliases count once).
    pub max_nodes: usize,
    /// Most nodes once every alias is expanded (the "billion laughs" budget).
    pub max_expanded_nodes: u64,
    /// Most steps in a process.
    pub max_steps: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_document_bytes: 16 * 1024 * 1024,
            max_depth: 64,
            max_string_bytes: 1024 * 1024,
            max_nodes: 2_000_000,
            max_expanded_nodes: 4_000_000,
            max_steps: 50_000,
        }
    }
}

/// The YAML merge key.
pub(crate) const MERGE_KEY: &str = "<<";

/// Index of a node in a [`Document`]'s arena.
pub(crate) type NodeId = u32;

/// What a scalar resolves to under the YAML 1.2 core schema.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ScalarValue {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    String,
}

/// A node's content. Text and children live in the document's shared
/// buffers (`text`, `children`), so a node costs no allocation of its own.
#[derive(Debug)]
enum Kind {
    /// `text[start..end]`.
    Scalar {
        start: u32,
        end: u32,
        value: ScalarValue,
    },
    /// `children[start..start + len]`.
    Sequence {
        start: u32,
        len: u32,
    },
    /// `children[start..start + 2 * len]`, key and value alternating.
    Mapping {
        start: u32,
        len: u32,
    },
    Alias(NodeId),
}

#[derive(Debug)]
struct NodeData {
    kind: Kind,
    at: Position,
    /// Nodes once aliases are expanded, saturating.
    expanded: u64,
}

/// A parsed YAML document: the arena and its root.
#[derive(Debug)]
pub(crate) struct Document {
    nodes: Vec<NodeData>,
    children: Vec<NodeId>,
    text: String,
    root: NodeId,
}

impl Document {
    pub(crate) fn root(&self) -> Node<'_> {
        Node { document: self, id: self.root, at: self.nodes[self.root as usize].at }.resolve()
    }

    /// The text of a scalar node, or of the scalar an alias refers to.
    fn scalar_text(&self, id: NodeId) -> Option<&str> {
        let kind = match self.nodes[id as usize].kind {
            Kind::Alias(target) => &self.nodes[target as usize].kind,
            ref kind => kind,
        };
        match kind {
            Kind::Scalar { start, end, .. } => self.text.get(*start as usize..*end as usize),
            _ => None,
        }
    }
}

/// String equality that rejects on length and first byte before comparing
/// the rest: keys are looked up often, and most candidates differ early.
pub(crate) fn same_text(left: &str, right: &str) -> bool {
    left.len() == right.len() && left.as_bytes().first() == right.as_bytes().first() && left == right
}

/// A view of one node; aliases are resolved but keep the alias's position.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Node<'a> {
    document: &'a Document,
    id: NodeId,
    at: Position,
}

impl<'a> Node<'a> {
    fn resolve(self) -> Self {
        match self.data().kind {
            Kind::Alias(target) => Node { document: self.document, id: target, at: self.at },
            _ => self,
        }
    }

    fn data(&self) -> &'a NodeData {
        &self.document.nodes[self.id as usize]
    }

    fn child(&self, id: NodeId) -> Node<'a> {
        Node { document: self.document, id, at: self.document.nodes[id as usize].at }.resolve()
    }

    pub(crate) fn position(&self) -> Position {
        self.at
    }

    fn kind(&self) -> &'a Kind {
        &self.data().kind
    }

    fn text(&self, start: u32, end: u32) -> &'a str {
        self.document.text.get(start as usize..end as usize).unwrap_or_default()
    }

    fn children(&self, start: u32, count: u32) -> &'a [NodeId] {
        let start = start as usize;
        self.document.children.get(start..start + count as usize).unwrap_or_default()
    }

    /// The node's text when it is a scalar of any type.
    pub(crate) fn scalar_text(&self) -> Option<&'a str> {
        match self.kind() {
            Kind::Scalar { start, end, .. } => Some(self.text(*start, *end)),
            _ => None,
        }
    }

    pub(crate) fn scalar_value(&self) -> Option<&'a ScalarValue> {
        match self.kind() {
            Kind::Scalar { value, .. } => Some(value),
            _ => None,
        }
    }

    /// The text of a string scalar (not null, bool or number).
    pub(crate) fn as_str(&self) -> Option<&'a str> {
        match self.kind() {
            Kind::Scalar { start, end, value: ScalarValue::String } => Some(self.text(*start, *end)),
            _ => None,
        }
    }

    pub(crate) fn as_i64(&self) -> Option<i64> {
        match self.scalar_value() {
            Some(ScalarValue::Int(value)) => Some(*value),
            _ => None,
        }
    }

    pub(crate) fn as_bool(&self) -> Option<bool> {
        match self.scalar_value() {
            Some(ScalarValue::Bool(value)) => Some(*value),
            _ => None,
        }
    }

    pub(crate) fn is_null(&self) -> bool {
        matches!(self.scalar_value(), Some(ScalarValue::Null))
    }

    pub(crate) fn is_mapping(&self) -> bool {
        matches!(self.kind(), Kind::Mapping { .. })
    }

    /// Python truthiness: null, false, 0, an empty string and an empty list or
    /// mapping are false, anything else is true. An executor that is not
    /// truthy is no executor.
    pub(crate) fn is_truthy(&self) -> bool {
        match self.kind() {
            Kind::Scalar { start, end, value } => match value {
                ScalarValue::Null => false,
                ScalarValue::Bool(flag) => *flag,
                ScalarValue::Int(number) => *number != 0,
                ScalarValue::Float(number) => *number != 0.0,
                ScalarValue::String => end > start,
            },
            Kind::Sequence { len, .. } | Kind::Mapping { len, .. } => *len > 0,
            Kind::Alias(_) => true,
        }
    }

    pub(crate) fn sequence(self) -> Option<impl ExactSizeIterator<Item = Node<'a>> + use<'a>> {
        let node = self;
        match self.kind() {
            Kind::Sequence { start, len } => Some(self.children(*start, *len).iter().map(move |id| node.child(*id))),
            _ => None,
        }
    }

    pub(crate) fn mapping(self) -> Option<impl ExactSizeIterator<Item = (Node<'a>, Node<'a>)> + use<'a>> {
        let node = self;
        match self.kind() {
            Kind::Mapping { start, len } => Some(
                self.children(*start, len.saturating_mul(2))
                    .chunks_exact(2)
                    .map(move |pair| (node.child(pair[0]), node.child(pair[1]))),
            ),
            _ => None,
        }
    }

    /// The value under a string key of a mapping, following YAML merge keys
    /// (`<<: *defaults`, `<<: [*a, *b]`): keys written in the mapping win,
    /// then the merged mappings in order.
    pub(crate) fn get(&self, key: &str) -> Option<Node<'a>> {
        let Kind::Mapping { start, len } = self.kind() else { return None };
        let mut merged = None;
        for pair in self.children(*start, len.saturating_mul(2)).chunks_exact(2) {
            match self.document.scalar_text(pair[0]) {
                Some(text) if same_text(text, key) => return Some(self.child(pair[1])),
                Some(MERGE_KEY) => merged = Some(self.child(pair[1])),
                _ => {}
            }
        }
        let merged = merged?;
        if merged.is_mapping() {
            return merged.get(key);
        }
        merged.sequence()?.find_map(|source| source.get(key))
    }

    /// True when a `<<` merge value is a mapping or a list of mappings.
    pub(crate) fn is_merge_source(&self) -> bool {
        self.is_mapping() || self.sequence().is_some_and(|mut items| items.all(|item| item.is_mapping()))
    }

    /// The key node itself (for positions of duplicate or unknown keys).
    pub(crate) fn key_node(&self, key: &str) -> Option<Node<'a>> {
        self.mapping()?.find(|(name, _)| name.scalar_text() == Some(key)).map(|(name, _)| name)
    }

    /// A short name of the node's type, for messages.
    pub(crate) fn type_name(&self) -> &'static str {
        match self.kind() {
            Kind::Scalar { value, .. } => match value {
                ScalarValue::Null => "null",
                ScalarValue::Bool(_) => "a boolean",
                ScalarValue::Int(_) => "an integer",
                ScalarValue::Float(_) => "a number",
                ScalarValue::String => "a string",
            },
            Kind::Sequence { .. } => "a list",
            Kind::Mapping { .. } => "a mapping",
            Kind::Alias(_) => "an alias",
        }
    }

    /// The node as compact JSON text, exactly as `to_json().to_string()`
    /// writes it (keys in order, merge keys applied), written straight from
    /// the tree when no merge key or repeated key needs the full conversion.
    pub(crate) fn to_json_text(self) -> String {
        let mut text = Vec::with_capacity(64);
        if self.write_json(&mut text).is_some()
            && let Ok(text) = String::from_utf8(text)
        {
            return text;
        }
        self.to_json().to_string()
    }

    /// Writes the node as JSON; `None` when it holds a merge key, a repeated
    /// key or a key that is not a scalar.
    fn write_json(self, out: &mut Vec<u8>) -> Option<()> {
        match self.kind() {
            Kind::Scalar { start, end, value } => {
                let text = self.text(*start, *end);
                match value {
                    ScalarValue::Null => out.extend_from_slice(b"null"),
                    ScalarValue::Bool(flag) => out.extend_from_slice(if *flag { b"true" } else { b"false" }),
                    ScalarValue::Int(number) => serde_json::to_writer(&mut *out, number).ok()?,
                    ScalarValue::Float(number) => match serde_json::Number::from_f64(*number) {
                        Some(number) => serde_json::to_writer(&mut *out, &number).ok()?,
                        None => serde_json::to_writer(&mut *out, text).ok()?,
                    },
                    ScalarValue::String => serde_json::to_writer(&mut *out, text).ok()?,
                }
            }
            Kind::Sequence { .. } => {
                out.push(b'[');
                for (index, item) in self.sequence()?.enumerate() {
                    if index > 0 {
                        out.push(b',');
                    }
                    item.write_json(out)?;
                }
                out.push(b']');
            }
            Kind::Mapping { len, .. } => {
                let mut entries: Vec<(&str, Node<'a>)> = Vec::with_capacity(*len as usize);
                for (key, value) in self.mapping()? {
                    let name = key.scalar_text().filter(|name| *name != MERGE_KEY)?;
                    entries.push((name, value));
                }
                // JSON objects here keep their keys sorted.
                entries.sort_unstable_by(|left, right| left.0.cmp(right.0));
                if entries.windows(2).any(|pair| pair[0].0 == pair[1].0) {
                    return None;
                }
                out.push(b'{');
                for (index, (name, value)) in entries.into_iter().enumerate() {
                    if index > 0 {
                        out.push(b',');
                    }
                    serde_json::to_writer(&mut *out, name).ok()?;
                    out.push(b':');
                    value.write_json(out)?;
                }
                out.push(b'}');
            }
            Kind::Alias(_) => out.extend_from_slice(b"null"),
        }
        Some(())
    }

    /// The node as JSON. Aliases are expanded; the expansion budget checked
    /// while parsing bounds the work.
    pub(crate) fn to_json(self) -> serde_json::Value {
        use serde_json::Value;
        match self.kind() {
            Kind::Scalar { start, end, value } => {
                let text = self.text(*start, *end);
                match value {
                    ScalarValue::Null => Value::Null,
                    ScalarValue::Bool(flag) => Value::Bool(*flag),
                    ScalarValue::Int(number) => Value::from(*number),
                    ScalarValue::Float(number) => serde_json::Number::from_f64(*number)
                        .map_or_else(|| Value::String(text.to_owned()), Value::Number),
                    ScalarValue::String => Value::String(text.to_owned()),
                }
            }
            Kind::Sequence { .. } => {
                Value::Array(self.sequence().into_iter().flatten().map(|item| item.to_json()).collect())
            }
            Kind::Mapping { .. } => {
                let mut object = serde_json::Map::new();
                let entries: Vec<(Node<'a>, Node<'a>)> = self.mapping().into_iter().flatten().collect();
                // Merged mappings first, the first source winning; then the
                // mapping's own keys, which override them.
                for (_, source) in entries.iter().filter(|(key, _)| key.scalar_text() == Some(MERGE_KEY)) {
                    let sources: Vec<Node<'a>> = match source.sequence() {
                        Some(items) => items.collect(),
                        None => vec![*source],
                    };
                    for source in sources.into_iter().rev() {
                        if let Value::Object(fields) = source.to_json() {
                            object.extend(fields);
                        }
                    }
                }
                for (key, value) in entries.iter().filter(|(key, _)| key.scalar_text() != Some(MERGE_KEY)) {
                    let name = key.scalar_text().map_or_else(|| key.to_json().to_string(), str::to_owned);
                    object.insert(name, value.to_json());
                }
                Value::Object(object)
            }
            Kind::Alias(_) => Value::Null,
        }
    }
}

/// What [`parse`] answers: the tree when it could be built, and every finding
/// made while reading (syntax errors, limits, duplicate keys).
#[derive(Debug)]
pub(crate) struct Parsed {
    pub(crate) document: Option<Document>,
    pub(crate) diagnostics: Vec<Diagnostic>,
}

#[cfg(test)]
mod tests {
    use super::{Limits, parse};

    #[test]
    fn json_text_is_what_the_json_values_write() {
        let documents = [
            "b: 1\na: [x, 'y', \"z\\u00e9\\n\"]\nc: {n: null, t: true, f: 1.5, e: 1e3, i: .inf, q: \"a\\\"b\"}\n",
            "z: 1\n\"1\": [[], {}]\n10: x\n2: y\n",
            "base: &b {x: 1, y: 2}\nwith: {<<: *b, y: 3}\n",
            "a: 1\na: 2\n",
            "list: &l [1, 2]\n? [k]\n: v\nother: *l\n",
            "é: ü\nA: -0\nn: .nan\n",
        ];
        for source in documents {
            let parsed = parse(source, &Limits::default());
            let root = parsed.document.as_ref().map(|document| document.root()).expect(source);
            assert_eq!(root.to_json_text(), root.to_json().to_string(), "{source}");
        }
    }
}
