//! The fast reader against the full parser: whatever it takes, it must build
//! exactly the tree (positions included) and the diagnostics the full parser
//! builds from the same text.

use super::super::builder::Builder;
use super::super::parse::read_events;
use super::super::{Limits, Parsed};
use super::read;

/// The fast reader's result, `None` when it declines.
fn fast(source: &str, limits: &Limits) -> Option<Parsed> {
    let mut builder = Builder::new(limits, source.len());
    read(source, &mut builder).ok().map(|()| builder.finish())
}

fn full(source: &str, limits: &Limits) -> Parsed {
    read_events(source, Builder::new(limits, source.len()))
}

/// Checks the two readers agree on `source`; true when the fast one took it.
fn agree(source: &str, limits: &Limits) -> bool {
    let Some(fast) = fast(source, limits) else { return false };
    let full = full(source, limits);
    assert_eq!(format!("{fast:?}"), format!("{full:?}"), "the readers differ on:\n{source}");
    true
}

#[test]
fn takes_the_block_yaml_processes_are_written_in() {
    let limits = Limits::default();
    let documents = [
        "name: x\nempty:\nnext: 1\nseq:\n- a\n-\n- 'q'\nafter: \"d\\\"q\"\n",
        "nested:\n  - id: s\n    deps: [a, 'b', [c]]\n    m: {x: 1, y: [2]}\n    em: []\n    ef: {}\n  -\n    k: v\n  - - inner\nlast:\n",
        "seq:\n-   a\nt:\n-  x\nu:\n- - b\nv:\n- k: 1\n  # c\n  j: 2\n# top\nw:   # comment\n   - 1   # c2\nx: a b  \ny: http://x#y\n",
        "a:\n  - \n  -  # x\n  -\ne: -5\nf: -x\ng: \"\\u00e9\\n\\t\\\\ \\/\"\nh: 'it''s'\ni: é\n",
        "m: a, b]{c}\nn: a[0] {x}\no: x:y\np: \"a\" # c\nq: ab#c\n\"r\": 1\n's' : 2\n",
        "- steps:\n  - a\n  - b\n- x\n",
        "key:\n  value on its own line\nother: 1\n",
        "dup: 1\ndup: 2\n",
        "números: [uno, \"dos\", 'tres']\nclé: é à\n",
        "plain\n",
        "- [a, {b: c}]\n- {}\n",
    ];
    for document in documents {
        assert!(agree(document, &limits), "the fast reader declined:\n{document}");
    }
    for path in ["process.yaml", "roster.yaml", "chain/digest.yaml", "loop/ping.yaml", "tpm/roster.yaml"] {
        let path = format!("{}/../examples/{path}", env!("CARGO_MANIFEST_DIR"));
        let source = std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{path}: {error}"));
        assert!(agree(&source, &limits), "the fast reader declined {path}");
    }
}

#[test]
fn leaves_the_rest_of_yaml_to_the_full_parser() {
    let limits = Limits::default();
    let documents = [
        "a: &x 1\nb: *x\n",
        "a: !!str 1\n",
        "a: |\n  text\n",
        "a: >\n  text\n",
        "a: b\n  continued\n",
        "a: [1,\n  2]\n",
        "a: 'open\n  quote'\n",
        "a:\tb\n",
        "a: b\r\nc: d\r\n",
        "---\na: 1\n",
        "a: 1\n---\nb: 2\n",
        "%YAML 1.2\n---\na: 1\n",
        "? complex\n: key\n",
        "a: \"\\x41\"\n",
        "a: b: c\n",
        "a: [b: c]\n",
        "a:\n- b\n c\n",
        "- a\nb: 1\n",
        "a: 1\n - b\n",
        "\u{feff}a: 1\n",
        "",
        "# only a comment\n",
    ];
    for document in documents {
        assert!(fast(document, &limits).is_none(), "the fast reader took:\n{document:?}");
    }
}

#[test]
fn a_limit_is_reported_by_the_full_parser_with_its_diagnostic() {
    let limits = Limits { max_depth: 2, max_string_bytes: 4, max_nodes: 6, ..Limits::default() };
    for document in ["a:\n  b:\n    c: 1\n", "a: longer than four\n", "a: 1\nb: 2\nc: 3\nd: 4\n"] {
        assert!(fast(document, &limits).is_none(), "the fast reader took:\n{document}");
        let parsed = super::super::parse(document, &limits);
        assert!(parsed.document.is_none() && !parsed.diagnostics.is_empty(), "{document}: {parsed:?}");
    }
}

/// A small deterministic generator of YAML-like text: block mappings and
/// sequences with every kind of scalar, flow, comment and indentation this
/// reader handles, and many it must decline.
struct Generator {
    state: u64,
    text: String,
}

impl Generator {
    fn next(&mut self) -> u64 {
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        self.state
    }

    fn below(&mut self, bound: usize) -> usize {
        (self.next() % bound as u64) as usize
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }

    /// Mostly scalars the fast reader takes, now and then one it declines.
    fn scalar(&mut self) -> &'static str {
        const TAKEN: &[&str] = &[
            "x",
            "1",
            "-5",
            "0x1f",
            "1.5",
            "1e3",
            ".inf",
            "true",
            "False",
            "null",
            "~",
            "a b",
            "a#b",
            "'it''s'",
            "'q'",
            "\"e\\u00e9\\n\"",
            "\"t\\tq\\\"\"",
            "[a, b]",
            "[]",
            "[ ]",
            "{x: 1, y: [2]}",
            "{}",
            "[a, [b, 'c'], {d: e}]",
            "http://x",
            "a, b]{c}",
            "é à",
            "x   ",
            "a:b",
            "\"\"",
            "''",
            "[\"a\", 'b']",
            "{\"k\": v}",
            "[a b, c]",
            "'a' # c",
            "-x-",
            "a #c",
        ];
        const DECLINED: &[&str] = &[
            "a: b",
            "\"bad\\q\"",
            "[a: b]",
            "[a,]",
            "{a: }",
            "&a x",
            "*a",
            "!!str 1",
            "|",
            "- x",
            "'unterminated",
            "? q",
            "-",
            ":x",
            "@x",
            "[a # c]",
            "\"a\"b",
            "%x",
            "a\tb",
        ];
        if self.below(8) > 0 { self.pick(TAKEN) } else { self.pick(DECLINED) }
    }

    fn key(&mut self) -> &'static str {
        const TAKEN: &[&str] =
            &["a", "name", "b c", "x-y", "\"q\"", "'s'", "k#", "é", "<<", "-k", "1", "true", "id", "steps", "key "];
        const DECLINED: &[&str] = &["a,b", "a]", "\"k\\\"\"", "?", "[k]"];
        if self.below(8) > 0 { self.pick(TAKEN) } else { self.pick(DECLINED) }
    }

    fn separator(&mut self) -> &'static str {
        self.pick(&[": ", ": ", ": ", ": ", ": ", ":  ", " : ", ":", ":\t"])
    }

    fn indent(&mut self, spaces: usize) {
        for _ in 0..spaces {
            self.text.push(' ');
        }
    }

    fn noise(&mut self, indent: usize) {
        match self.below(12) {
            0 => self.text.push('\n'),
            1 => {
                let extra = self.below(3);
                self.indent(indent + extra);
                self.text.push_str("# a comment: [x]\n");
            }
            2 => self.text.push_str("   \n"),
            _ => {}
        }
    }

    fn end_of_line(&mut self) {
        match self.below(8) {
            0 => self.text.push_str(" # comment"),
            1 => self.text.push_str("  "),
            2 if self.below(20) == 0 => self.text.push_str("#x"),
            _ => {}
        }
        self.text.push('\n');
    }

    /// A deeper indentation, now and then the same or a shallower one.
    fn deeper(&mut self, indent: usize) -> usize {
        match self.below(40) {
            0 => indent,
            1 => indent.saturating_sub(1),
            _ => indent + 1 + self.below(3),
        }
    }

    /// What follows a key or a `-`: a value on the line, or a block below.
    fn value(&mut self, indent: usize, depth: usize, in_mapping: bool) {
        if depth < 4 && self.below(3) == 0 {
            self.end_of_line();
            self.noise(indent);
            let inner = self.deeper(indent);
            // A sequence under a key may sit at the key's own indentation.
            if in_mapping && self.below(3) == 0 {
                self.sequence(indent, depth + 1);
            } else if self.below(2) == 0 {
                self.mapping(inner, depth + 1);
            } else {
                self.sequence(inner, depth + 1);
            }
        } else if self.below(10) == 0 {
            self.end_of_line();
        } else {
            let scalar = self.scalar();
            self.text.push_str(scalar);
            self.end_of_line();
        }
    }

    fn mapping(&mut self, indent: usize, depth: usize) {
        for index in 0..1 + self.below(4) {
            if index > 0 {
                self.indent(indent);
            }
            let key = self.key();
            self.text.push_str(key);
            let separator = self.separator();
            self.text.push_str(separator);
            self.value(indent, depth, true);
            self.noise(indent);
        }
    }

    fn sequence(&mut self, indent: usize, depth: usize) {
        for index in 0..1 + self.below(4) {
            if index > 0 || self.text.ends_with('\n') || self.text.is_empty() {
                self.indent(indent);
            }
            match self.below(6) {
                0 if depth < 4 => {
                    // A compact mapping in the item.
                    let spaces = 1 + self.below(2);
                    self.text.push('-');
                    self.indent(spaces);
                    self.mapping(indent + 1 + spaces, depth + 1);
                }
                1 if depth < 4 => {
                    self.text.push_str("- ");
                    self.sequence(indent + 2, depth + 1);
                }
                2 => {
                    self.text.push('-');
                    self.value(indent, depth, false);
                }
                _ => {
                    self.text.push_str("- ");
                    self.value(indent, depth, false);
                }
            }
            self.noise(indent);
        }
    }

    fn document(&mut self) -> String {
        self.text.clear();
        self.noise(0);
        match self.below(10) {
            0 => self.sequence(0, 0),
            1 => {
                let scalar = self.scalar();
                self.text.push_str(scalar);
                self.text.push('\n');
            }
            _ => self.mapping(0, 0),
        }
        if self.below(4) == 0 {
            self.text.pop();
        }
        self.text.clone()
    }
}

#[test]
fn agrees_with_the_full_parser_on_generated_documents() {
    let limits = Limits::default();
    let mut generator = Generator { state: 0x9e37_79b9_7f4a_7c15, text: String::new() };
    let (mut taken, mut declined) = (0, 0);
    for _ in 0..30_000 {
        let document = generator.document();
        if agree(&document, &limits) {
            taken += 1;
        } else {
            declined += 1;
        }
    }
    // Both paths must be exercised for the comparison to mean anything.
    assert!(taken > 5_000 && declined > 5_000, "taken {taken}, declined {declined}");
}
