//! YAML with positions: the one place that knows the YAML parser (STYLE rule
//! 14). [`parse`] turns `saphyr-parser` events into a small node tree in an
//! arena where every node keeps its line and column. An alias is a reference
//! to the anchored node, never a copy, and every node knows its expanded size,
//! so a "billion laughs" document is refused while it is read, in memory
//! proportional to its text. Every limit answers with a diagnostic.

use std::collections::{HashMap, HashSet};

use saphyr_parser::{Event, Parser, ScalarStyle, ScanError, Span};

use super::diagnostic::{Diagnostic, Position, Severity};

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

    /// Python truthiness, as seed 000's `if not executor` reads it.
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
        let mut merged = None;
        for (name, value) in self.mapping()? {
            match name.scalar_text() {
                Some(text) if text == key => return Some(value),
                Some(MERGE_KEY) => merged = Some(value),
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

/// An open sequence or mapping; its children so far are
/// `scratch[first_child..]` (for a mapping, keys and values alternating).
struct Frame {
    is_mapping: bool,
    first_child: usize,
    anchor: usize,
    at: Position,
    expanded: u64,
    /// Keys seen, once a mapping is large enough for a linear scan to hurt.
    key_set: Option<HashSet<String>>,
}

struct Builder<'l> {
    limits: &'l Limits,
    nodes: Vec<NodeData>,
    children: Vec<NodeId>,
    text: String,
    scratch: Vec<NodeId>,
    stack: Vec<Frame>,
    anchors: HashMap<usize, NodeId>,
    open_anchors: Vec<usize>,
    root: Option<NodeId>,
    documents: usize,
    diagnostics: Vec<Diagnostic>,
}

fn position(span: &Span) -> Position {
    Position {
        line: u32::try_from(span.start.line()).unwrap_or(u32::MAX),
        column: u32::try_from(span.start.col().saturating_add(1)).unwrap_or(u32::MAX),
    }
}

fn limit(code: &'static str, at: Position, message: String) -> Diagnostic {
    Diagnostic { severity: Severity::Error, code, message, path: String::new(), line: at.line, column: at.column }
}

/// Parses one YAML document. Never panics; stops at the first syntax error or
/// exceeded limit with a diagnostic and no tree.
pub(crate) fn parse(source: &str, limits: &Limits) -> Parsed {
    if source.len() > limits.max_document_bytes {
        return Parsed {
            document: None,
            diagnostics: vec![limit(
                "YAML002",
                Position { line: 1, column: 1 },
                format!(
                    "the document is {} bytes, more than the limit of {} bytes",
                    source.len(),
                    limits.max_document_bytes
                ),
            )],
        };
    }
    let mut builder = Builder {
        limits,
        nodes: Vec::with_capacity(source.len() / 8),
        children: Vec::with_capacity(source.len() / 8),
        text: String::with_capacity(source.len()),
        scratch: Vec::new(),
        stack: Vec::new(),
        anchors: HashMap::new(),
        open_anchors: Vec::new(),
        root: None,
        documents: 0,
        diagnostics: Vec::new(),
    };
    for item in Parser::new_from_str(source) {
        let outcome = match item {
            Ok((event, span)) => builder.event(event, &span),
            Err(error) => Err(syntax_error(&error, limits)),
        };
        if let Err(diagnostic) = outcome {
            builder.diagnostics.push(diagnostic);
            return Parsed { document: None, diagnostics: builder.diagnostics };
        }
    }
    match builder.root {
        Some(root) => Parsed {
            document: Some(Document { nodes: builder.nodes, children: builder.children, text: builder.text, root }),
            diagnostics: builder.diagnostics,
        },
        None => {
            builder.diagnostics.push(limit(
                "YAML007",
                Position { line: 1, column: 1 },
                "the document is empty".to_owned(),
            ));
            Parsed { document: None, diagnostics: builder.diagnostics }
        }
    }
}

fn syntax_error(error: &ScanError, limits: &Limits) -> Diagnostic {
    let marker = error.marker();
    let at = Position {
        line: u32::try_from(marker.line()).unwrap_or(u32::MAX),
        column: u32::try_from(marker.col().saturating_add(1)).unwrap_or(u32::MAX),
    };
    // The scanner reads ahead of the events and has its own flow-nesting
    // bound; report it as the depth limit it is.
    if error.info().contains("recursion limit") {
        return limit(
            "YAML003",
            at,
            format!("the document nests deeper than the limit of {} levels", limits.max_depth),
        );
    }
    limit("YAML001", at, format!("YAML syntax error: {}", error.info()))
}

fn too_large(at: Position) -> Diagnostic {
    limit("YAML006", at, "the document is too large to index".to_owned())
}

impl Builder<'_> {
    fn event(&mut self, event: Event<'_>, span: &Span) -> Result<(), Diagnostic> {
        let at = position(span);
        match event {
            Event::DocumentStart(_) => {
                self.documents += 1;
                if self.documents > 1 {
                    return Err(limit("YAML008", at, "expected a single YAML document, found several".to_owned()));
                }
            }
            Event::Scalar(text, style, anchor, tag) => {
                if text.len() > self.limits.max_string_bytes {
                    return Err(limit(
                        "YAML005",
                        at,
                        format!(
                            "a string of {} bytes is longer than the limit of {} bytes",
                            text.len(),
                            self.limits.max_string_bytes
                        ),
                    ));
                }
                let forced_string = tag.as_ref().is_some_and(|tag| tag.suffix == "str");
                let value = if style == ScalarStyle::Plain && !forced_string {
                    resolve_plain(&text)
                } else {
                    ScalarValue::String
                };
                let start = u32::try_from(self.text.len()).map_err(|_| too_large(at))?;
                self.text.push_str(&text);
                let end = u32::try_from(self.text.len()).map_err(|_| too_large(at))?;
                let id = self.add(Kind::Scalar { start, end, value }, at, 1)?;
                self.register(anchor, id);
                self.attach(id, at)?;
            }
            Event::Alias(anchor) => {
                let Some(&target) = self.anchors.get(&anchor) else {
                    let message = if self.open_anchors.contains(&anchor) {
                        "an alias refers to the node that contains it (recursive alias)"
                    } else {
                        "an alias refers to an unknown anchor"
                    };
                    return Err(limit("YAML004", at, message.to_owned()));
                };
                let expanded = self.nodes[target as usize].expanded;
                let id = self.add(Kind::Alias(target), at, expanded)?;
                self.attach(id, at)?;
            }
            Event::SequenceStart(anchor, _) => self.open(false, anchor, at)?,
            Event::MappingStart(anchor, _) => self.open(true, anchor, at)?,
            Event::SequenceEnd | Event::MappingEnd => {
                let Some(frame) = self.stack.pop() else { return Ok(()) };
                let start = u32::try_from(self.children.len()).map_err(|_| too_large(frame.at))?;
                let count = self.scratch.len() - frame.first_child;
                self.children.extend(self.scratch.drain(frame.first_child..));
                let kind = if frame.is_mapping {
                    Kind::Mapping { start, len: u32::try_from(count / 2).map_err(|_| too_large(frame.at))? }
                } else {
                    Kind::Sequence { start, len: u32::try_from(count).map_err(|_| too_large(frame.at))? }
                };
                if frame.anchor != 0 {
                    self.open_anchors.retain(|open| *open != frame.anchor);
                }
                let id = self.add(kind, frame.at, frame.expanded)?;
                self.register(frame.anchor, id);
                self.attach(id, frame.at)?;
            }
            Event::StreamStart | Event::StreamEnd | Event::DocumentEnd | Event::Nothing => {}
        }
        Ok(())
    }

    fn open(&mut self, is_mapping: bool, anchor: usize, at: Position) -> Result<(), Diagnostic> {
        if self.stack.len() >= self.limits.max_depth {
            return Err(limit(
                "YAML003",
                at,
                format!("the document nests deeper than the limit of {} levels", self.limits.max_depth),
            ));
        }
        if anchor != 0 {
            self.open_anchors.push(anchor);
        }
        self.stack.push(Frame { is_mapping, first_child: self.scratch.len(), anchor, at, expanded: 1, key_set: None });
        Ok(())
    }

    fn add(&mut self, kind: Kind, at: Position, expanded: u64) -> Result<NodeId, Diagnostic> {
        if self.nodes.len() >= self.limits.max_nodes {
            return Err(limit(
                "YAML006",
                at,
                format!("the document has more than the limit of {} nodes", self.limits.max_nodes),
            ));
        }
        let id = NodeId::try_from(self.nodes.len()).map_err(|_| too_large(at))?;
        self.nodes.push(NodeData { kind, at, expanded });
        Ok(id)
    }

    fn register(&mut self, anchor: usize, id: NodeId) {
        if anchor != 0 {
            self.anchors.insert(anchor, id);
        }
    }

    /// Adds a finished node to the open container (or makes it the root) and
    /// charges its expanded size to the container.
    fn attach(&mut self, id: NodeId, at: Position) -> Result<(), Diagnostic> {
        let size = self.nodes[id as usize].expanded;
        let Some(frame) = self.stack.last_mut() else {
            self.root = Some(id);
            return Ok(());
        };
        let siblings = &self.scratch[frame.first_child..];
        // In a mapping, a node at an even offset is a key.
        if frame.is_mapping
            && siblings.len().is_multiple_of(2)
            && let Some(duplicate) = duplicate_key(&self.nodes, &self.text, siblings, &mut frame.key_set, id)
        {
            self.diagnostics.push(duplicate);
        }
        self.scratch.push(id);
        frame.expanded = frame.expanded.saturating_add(size);
        let budget = self.limits.max_expanded_nodes;
        if frame.expanded > budget {
            return Err(limit(
                "YAML004",
                at,
                format!(
                    "aliases expand the document beyond the limit of {budget} nodes (a \"billion laughs\" document?)"
                ),
            ));
        }
        Ok(())
    }
}

/// Finds a repeated scalar key: a linear scan while the mapping is small, a
/// set once it is large (a hostile mapping of a million keys stays linear).
fn duplicate_key(
    nodes: &[NodeData],
    text: &str,
    siblings: &[NodeId],
    key_set: &mut Option<HashSet<String>>,
    key_id: NodeId,
) -> Option<Diagnostic> {
    const SMALL: usize = 32;
    let scalar_text = |id: NodeId| match &nodes[id as usize].kind {
        Kind::Scalar { start, end, .. } => text.get(*start as usize..*end as usize),
        _ => None,
    };
    let key = scalar_text(key_id)?;
    let keys = siblings.iter().step_by(2);
    if key_set.is_none() && siblings.len() / 2 >= SMALL {
        *key_set = Some(keys.clone().filter_map(|existing| scalar_text(*existing)).map(str::to_owned).collect());
    }
    let is_duplicate = match key_set {
        Some(set) => !set.insert(key.to_owned()),
        None => keys.into_iter().any(|existing| scalar_text(*existing) == Some(key)),
    };
    is_duplicate.then(|| {
        let at = nodes[key_id as usize].at;
        limit("YAML009", at, format!("duplicate key '{key}' in a mapping"))
    })
}

/// Resolves a plain scalar under the YAML 1.2 core schema.
pub(crate) fn resolve_plain(text: &str) -> ScalarValue {
    match text {
        "" | "~" | "null" | "Null" | "NULL" => return ScalarValue::Null,
        "true" | "True" | "TRUE" => return ScalarValue::Bool(true),
        "false" | "False" | "FALSE" => return ScalarValue::Bool(false),
        ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" => return ScalarValue::Float(f64::INFINITY),
        "-.inf" | "-.Inf" | "-.INF" => return ScalarValue::Float(f64::NEG_INFINITY),
        ".nan" | ".NaN" | ".NAN" => return ScalarValue::Float(f64::NAN),
        _ => {}
    }
    let digits = text.strip_prefix(['-', '+']).unwrap_or(text);
    if !digits.is_empty() && digits.bytes().all(|byte| byte.is_ascii_digit()) {
        return text.parse::<i64>().map_or_else(|_| float_or_string(text), ScalarValue::Int);
    }
    if let Some(octal) = text.strip_prefix("0o")
        && let Ok(number) = i64::from_str_radix(octal, 8)
    {
        return ScalarValue::Int(number);
    }
    if let Some(hex) = text.strip_prefix("0x")
        && let Ok(number) = i64::from_str_radix(hex, 16)
    {
        return ScalarValue::Int(number);
    }
    if looks_like_float(digits) {
        return float_or_string(text);
    }
    ScalarValue::String
}

fn float_or_string(text: &str) -> ScalarValue {
    text.parse::<f64>().map_or(ScalarValue::String, ScalarValue::Float)
}

/// `(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?`
fn looks_like_float(text: &str) -> bool {
    let (mantissa, exponent) = match text.find(['e', 'E']) {
        Some(index) => (&text[..index], Some(&text[index + 1..])),
        None => (text, None),
    };
    let mantissa_ok = match mantissa.split_once('.') {
        Some((whole, fraction)) => {
            whole.bytes().all(|byte| byte.is_ascii_digit())
                && fraction.bytes().all(|byte| byte.is_ascii_digit())
                && !(whole.is_empty() && fraction.is_empty())
        }
        None => !mantissa.is_empty() && mantissa.bytes().all(|byte| byte.is_ascii_digit()),
    };
    let exponent_ok = exponent.is_none_or(|exponent| {
        let digits = exponent.strip_prefix(['-', '+']).unwrap_or(exponent);
        !digits.is_empty() && digits.bytes().all(|byte| byte.is_ascii_digit())
    });
    mantissa_ok && exponent_ok
}
