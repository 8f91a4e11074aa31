//! The node tree under construction, with every limit: what both readers
//! (the full parser's events and the fast reader) feed, so the tree and its
//! diagnostics are the same whichever reads the document.

use std::collections::{HashMap, HashSet};

use saphyr_parser::{Event, ScalarStyle, Span};

use super::scalar::resolve_plain;
use super::{Document, Kind, Limits, NodeData, NodeId, Parsed, ScalarValue, same_text};
use crate::diagnostic::{Diagnostic, Position, Severity};

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

pub(super) struct Builder<'l> {
    pub(super) limits: &'l Limits,
    nodes: Vec<NodeData>,
    children: Vec<NodeId>,
    text: String,
    scratch: Vec<NodeId>,
    stack: Vec<Frame>,
    anchors: HashMap<usize, NodeId>,
    open_anchors: Vec<usize>,
    root: Option<NodeId>,
    documents: usize,
    pub(super) diagnostics: Vec<Diagnostic>,
}

impl<'l> Builder<'l> {
    pub(super) fn new(limits: &'l Limits, source_bytes: usize) -> Self {
        Builder {
            limits,
            nodes: Vec::with_capacity(source_bytes / 8),
            children: Vec::with_capacity(source_bytes / 8),
            text: String::with_capacity(source_bytes),
            scratch: Vec::new(),
            stack: Vec::new(),
            anchors: HashMap::new(),
            open_anchors: Vec::new(),
            root: None,
            documents: 0,
            diagnostics: Vec::new(),
        }
    }

    /// Forgets everything built so far, keeping the buffers.
    pub(super) fn clear(&mut self) {
        self.nodes.clear();
        self.children.clear();
        self.text.clear();
        self.scratch.clear();
        self.stack.clear();
        self.anchors.clear();
        self.open_anchors.clear();
        self.root = None;
        self.documents = 0;
        self.diagnostics.clear();
    }

    pub(super) fn finish(mut self) -> Parsed {
        match self.root {
            Some(root) => Parsed {
                document: Some(Document { nodes: self.nodes, children: self.children, text: self.text, root }),
                diagnostics: self.diagnostics,
            },
            None => {
                self.diagnostics.push(limit(
                    "YAML007",
                    Position { line: 1, column: 1 },
                    "the document is empty".to_owned(),
                ));
                Parsed { document: None, diagnostics: self.diagnostics }
            }
        }
    }

    pub(super) fn event(&mut self, event: Event<'_>, span: &Span) -> Result<(), Diagnostic> {
        let at = position(span);
        match event {
            Event::DocumentStart(_) => self.document_start(at),
            Event::Scalar(text, style, anchor, tag) => {
                let forced_string = tag.as_ref().is_some_and(|tag| tag.suffix == "str");
                self.scalar(&text, style == ScalarStyle::Plain && !forced_string, anchor, at)
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
                self.attach(id, at)
            }
            Event::SequenceStart(anchor, _) => self.open(false, anchor, at),
            Event::MappingStart(anchor, _) => self.open(true, anchor, at),
            Event::SequenceEnd | Event::MappingEnd => self.close(),
            Event::StreamStart | Event::StreamEnd | Event::DocumentEnd | Event::Nothing => Ok(()),
        }
    }

    pub(super) fn document_start(&mut self, at: Position) -> Result<(), Diagnostic> {
        self.documents += 1;
        if self.documents > 1 {
            return Err(limit("YAML008", at, "expected a single YAML document, found several".to_owned()));
        }
        Ok(())
    }

    /// A scalar; `plain` when its type is resolved from its text (a plain
    /// scalar without a `!!str` tag), otherwise it is a string.
    pub(super) fn scalar(&mut self, text: &str, plain: bool, anchor: usize, at: Position) -> Result<(), Diagnostic> {
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
        let value = if plain { resolve_plain(text) } else { ScalarValue::String };
        let start = u32::try_from(self.text.len()).map_err(|_| too_large(at))?;
        self.text.push_str(text);
        let end = u32::try_from(self.text.len()).map_err(|_| too_large(at))?;
        let id = self.add(Kind::Scalar { start, end, value }, at, 1)?;
        self.register(anchor, id);
        self.attach(id, at)
    }

    /// Ends the innermost open sequence or mapping.
    pub(super) fn close(&mut self) -> Result<(), Diagnostic> {
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
        self.attach(id, frame.at)
    }

    pub(super) fn open(&mut self, is_mapping: bool, anchor: usize, at: Position) -> Result<(), Diagnostic> {
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
        None => keys.into_iter().any(|existing| scalar_text(*existing).is_some_and(|text| same_text(text, key))),
    };
    is_duplicate.then(|| {
        let at = nodes[key_id as usize].at;
        limit("YAML009", at, format!("duplicate key '{key}' in a mapping"))
    })
}

fn position(span: &Span) -> Position {
    Position {
        line: u32::try_from(span.start.line()).unwrap_or(u32::MAX),
        column: u32::try_from(span.start.col().saturating_add(1)).unwrap_or(u32::MAX),
    }
}

pub(super) fn limit(code: &'static str, at: Position, message: String) -> Diagnostic {
    Diagnostic { severity: Severity::Error, code, message, path: String::new(), line: at.line, column: at.column }
}

fn too_large(at: Position) -> Diagnostic {
    limit("YAML006", at, "the document is too large to index".to_owned())
}
