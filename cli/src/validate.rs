//! `muster validate FILE...`: the validator's rules, offline. Prints each
//! finding as a compiler does (`error[CODE]: message`, `--> file:line:col`,
//! the source line with a caret, the path in the document), in colour on a
//! terminal unless `NO_COLOR` is set, or, with `--format json`, one JSON array
//! of findings. `muster run`, `publish` and `matrix apply` print a service's
//! findings the same way.
//! Exit code 0 when no file has an error, 1 when one has, 2 when a file cannot
//! be read.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use annotate_snippets::{AnnotationKind, Level, Origin, Renderer, Snippet};
use muster_format::{Context, Diagnostic, DocumentKind, RoleFormat, roster::import::ImportFile};

/// How findings are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum OutputFormat {
    /// Compiler-style lines with the source line and a caret.
    Text,
    /// One JSON array of `{file, severity, code, message, path, line, column}`.
    Json,
}

/// What the files are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum KindArg {
    /// `.md` is a role; YAML with `steps` is a process; with `agents` or
    /// `teams` a roster; with a `roles` mapping of `can`/`cannot` lists a
    /// permission matrix; else a role definition. Given with a roster, `.md`
    /// files are its role definitions, checked as one import.
    Auto,
    /// A process definition.
    Process,
    /// A role definition (YAML, or Markdown for `.md` files).
    Role,
    /// A permission matrix.
    Matrix,
    /// The files of one roster import: YAML rosters and `.md` role definitions.
    Roster,
}

/// Arguments of `muster validate`.
#[derive(Debug, clap::Args)]
pub(crate) struct ValidateArgs {
    /// The files to check.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Output format (`--output` is the same flag, as on the other commands).
    #[arg(long, alias = "output", value_enum, default_value = "text")]
    format: OutputFormat,
    /// What the files are.
    #[arg(long, value_enum, default_value = "auto")]
    kind: KindArg,
}

/// The findings of one file.
struct FileReport {
    file: String,
    source: String,
    diagnostics: Vec<Diagnostic>,
}

/// Runs `muster validate`.
pub(crate) fn run(args: &ValidateArgs) -> ExitCode {
    let mut unreadable = false;
    let mut read = Vec::with_capacity(args.files.len());
    for path in &args.files {
        match std::fs::read_to_string(path) {
            Ok(source) => read.push((path.as_path(), source)),
            Err(error) => {
                eprintln!("{}: error: cannot read the file: {error}", path.display());
                unreadable = true;
            }
        }
    }
    let reports = validate_files(&read, args.kind);
    match args.format {
        OutputFormat::Text => {
            for report in &reports {
                let findings = report.diagnostics.iter().map(Finding::from);
                print!("{}", render_text(&report.file, &report.source, findings, colour(true)));
            }
            let (errors, warnings) = count(&reports);
            if args.files.len() > 1 || errors + warnings > 0 {
                eprintln!("{} file(s) checked: {errors} error(s), {warnings} warning(s)", reports.len());
            }
        }
        OutputFormat::Json => println!("{}", render_json(&reports)),
    }
    let has_errors = reports.iter().any(|report| report.diagnostics.iter().any(Diagnostic::is_error));
    ExitCode::from(exit_code(unreadable, has_errors))
}

fn count(reports: &[FileReport]) -> (usize, usize) {
    let all = reports.iter().flat_map(|report| &report.diagnostics);
    let errors = all.clone().filter(|diagnostic| diagnostic.is_error()).count();
    let warnings = all.count() - errors;
    (errors, warnings)
}

/// 2 when a file could not be read, else 1 when any finding is an error, else 0.
fn exit_code(unreadable: bool, has_errors: bool) -> u8 {
    if unreadable {
        2
    } else if has_errors {
        1
    } else {
        0
    }
}

fn is_markdown(path: &Path) -> bool {
    path.extension()
        .and_then(|extension| extension.to_str())
        .is_some_and(|extension| extension.eq_ignore_ascii_case("md") || extension.eq_ignore_ascii_case("markdown"))
}

/// What the file is, resolving `auto`.
fn resolve_kind(path: &Path, source: &str, kind: KindArg) -> DocumentKind {
    match kind {
        KindArg::Process => DocumentKind::Process,
        KindArg::Role => DocumentKind::RoleDefinition,
        KindArg::Matrix => DocumentKind::PermissionMatrix,
        KindArg::Roster => DocumentKind::Roster,
        KindArg::Auto if is_markdown(path) => DocumentKind::RoleDefinition,
        KindArg::Auto => muster_format::detect_yaml_kind(source),
    }
}

/// The findings of each file, in the order given. The files of a roster
/// (and, beside one, the `.md` role definitions) are checked together, as
/// one import, so that references between them resolve.
fn validate_files(files: &[(&Path, String)], kind: KindArg) -> Vec<FileReport> {
    let kinds: Vec<DocumentKind> = files.iter().map(|(path, source)| resolve_kind(path, source, kind)).collect();
    let with_roster = kinds.contains(&DocumentKind::Roster);
    let in_roster = |index: usize| kinds[index] == DocumentKind::Roster || (with_roster && is_markdown(files[index].0));
    let roster: Vec<ImportFile> = (0..files.len())
        .filter(|index| in_roster(*index))
        .map(|index| ImportFile { name: files[index].0.display().to_string(), content: files[index].1.clone() })
        .collect();
    let roster_findings = muster_format::roster::import::validate_files(&roster);
    files
        .iter()
        .enumerate()
        .map(|(index, (path, source))| {
            let file = path.display().to_string();
            let diagnostics = if in_roster(index) {
                let mine =
                    roster_findings.iter().filter(|finding| finding.file_name == file || finding.file_name.is_empty());
                mine.map(|finding| finding.to_diagnostic()).collect()
            } else {
                validate_file(path, source, kinds[index])
            };
            FileReport { file, source: source.clone(), diagnostics }
        })
        .collect()
}

fn validate_file(path: &Path, source: &str, kind: DocumentKind) -> Vec<Diagnostic> {
    let context = Context::default();
    match kind {
        DocumentKind::Process => muster_format::validate_process(source, &context).diagnostics,
        DocumentKind::PermissionMatrix => muster_format::validate_permission_matrix(source).diagnostics,
        DocumentKind::Roster => {
            let file = ImportFile { name: path.display().to_string(), content: source.to_owned() };
            muster_format::roster::import::validate_files(&[file]).iter().map(|found| found.to_diagnostic()).collect()
        }
        DocumentKind::RoleDefinition => {
            let format = if is_markdown(path) { RoleFormat::Markdown } else { RoleFormat::Yaml };
            muster_format::validate_role_definition(source, format, &context).diagnostics
        }
    }
}

/// One finding as the renderer shows it: from this library's checks, or
/// from a service's answer (`muster run`, `muster matrix apply`), so both
/// read the same.
pub(crate) struct Finding<'a> {
    severity: &'a str,
    code: &'a str,
    message: &'a str,
    path: &'a str,
    line: u32,
    column: u32,
}

impl<'a> From<&'a Diagnostic> for Finding<'a> {
    fn from(diagnostic: &'a Diagnostic) -> Self {
        Self {
            severity: diagnostic.severity.as_str(),
            code: diagnostic.code,
            message: &diagnostic.message,
            path: &diagnostic.path,
            line: diagnostic.line,
            column: diagnostic.column,
        }
    }
}

impl<'a> From<&'a muster_proto::common::v1::Diagnostic> for Finding<'a> {
    fn from(diagnostic: &'a muster_proto::common::v1::Diagnostic) -> Self {
        let error = diagnostic.severity == muster_proto::common::v1::Severity::Error as i32;
        Self {
            severity: if error { "error" } else { "warning" },
            code: &diagnostic.code,
            message: &diagnostic.message,
            path: &diagnostic.path,
            line: diagnostic.line,
            column: diagnostic.column,
        }
    }
}

/// Whether text written to standard output (`stdout`) or error gets colour:
/// only on a terminal, and never with `NO_COLOR` set to anything but empty.
pub(crate) fn colour(stdout: bool) -> bool {
    use std::io::IsTerminal as _;
    let terminal = if stdout { std::io::stdout().is_terminal() } else { std::io::stderr().is_terminal() };
    terminal && std::env::var_os("NO_COLOR").is_none_or(|value| value.is_empty())
}

/// The byte range in `text` of the character at 1-based `column` (empty
/// past the end of the line).
fn column_range(text: &str, column: u32) -> std::ops::Range<usize> {
    let skip = usize::try_from(column.saturating_sub(1)).unwrap_or(usize::MAX);
    match text.char_indices().nth(skip) {
        Some((offset, character)) => offset..offset + character.len_utf8(),
        None => text.len()..text.len(),
    }
}

/// Each finding as a compiler renders it: severity, code and message, where
/// (`--> file:line:column`), the source line with a caret under the column,
/// and the path in the document; coloured when `colour` says so. Only the
/// offending line goes to the renderer, so a large document with many
/// findings costs no more than its findings.
pub(crate) fn render_text<'a>(
    file: &str,
    source: &str,
    findings: impl IntoIterator<Item = Finding<'a>>,
    colour: bool,
) -> String {
    let renderer = if colour { Renderer::styled() } else { Renderer::plain() };
    let lines: Vec<&str> = source.lines().collect();
    let mut out = String::new();
    for finding in findings {
        let level = if finding.severity == "error" { Level::ERROR } else { Level::WARNING };
        let title = level.primary_title(finding.message).id(finding.code);
        let line = usize::try_from(finding.line).unwrap_or(0);
        let mut group = match line.checked_sub(1).and_then(|index| lines.get(index)) {
            Some(text) => title.element(
                Snippet::source(*text)
                    .line_start(line)
                    .path(file)
                    .annotation(AnnotationKind::Primary.span(column_range(text, finding.column))),
            ),
            // Past the last line (a YAML error at the end of the document):
            // the caret goes after the last line's end.
            None if line == lines.len() + 1 && !lines.is_empty() => {
                let last = lines[lines.len() - 1];
                let end = column_range(last, last.chars().count() as u32 + 1);
                title.element(
                    Snippet::source(last)
                        .line_start(lines.len())
                        .path(file)
                        .annotation(AnnotationKind::Primary.span(end).label("the document ends here")),
                )
            }
            None if line > 0 => title.element(Origin::path(file).line(line).char_column(finding.column as usize)),
            None => title.element(Origin::path(file)),
        };
        if !finding.path.is_empty() {
            group = group.element(Level::NOTE.message(format!("at {}", finding.path)));
        }
        out.push_str(&renderer.render(&[group]));
        out.push_str("\n\n");
    }
    out
}

/// One JSON array of every finding of every file.
fn render_json(reports: &[FileReport]) -> String {
    let entries: Vec<serde_json::Value> = reports
        .iter()
        .flat_map(|report| {
            report.diagnostics.iter().map(|diagnostic| {
                serde_json::json!({
                    "file": report.file,
                    "severity": diagnostic.severity.as_str(),
                    "code": diagnostic.code,
                    "message": diagnostic.message,
                    "path": diagnostic.path,
                    "line": diagnostic.line,
                    "column": diagnostic.column,
                })
            })
        })
        .collect();
    serde_json::Value::Array(entries).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const NO_EXECUTOR: &str = "name: p\nsteps:\n  - id: a\n    type: agent_task\n    agent: x\n    message: m\n    roles:\n      monitors: [y]\n";

    #[test]
    fn text_output_is_compiler_style_with_a_caret() {
        let diagnostics = validate_file(
            Path::new("p.yaml"),
            NO_EXECUTOR,
            resolve_kind(Path::new("p.yaml"), NO_EXECUTOR, KindArg::Auto),
        );
        let text = render_text("p.yaml", NO_EXECUTOR, diagnostics.iter().map(Finding::from), false);
        assert_eq!(
            text,
            "error[EMI002]: Roles must include an 'executor' agent\n --> p.yaml:7:5\n  |\n7 |     roles:\n  |     ^\n  |\n  = note: at steps[0].roles\n\n"
        );
        let coloured = render_text("p.yaml", NO_EXECUTOR, diagnostics.iter().map(Finding::from), true);
        assert!(coloured.contains("\u{1b}[") && coloured.contains("EMI002"), "{coloured:?}");
    }

    #[test]
    fn carets_follow_tabs_and_findings_off_the_text_name_the_place() {
        let diagnostic = Diagnostic {
            severity: muster_format::Severity::Warning,
            code: "X001",
            message: "m".to_owned(),
            path: String::new(),
            line: 1,
            column: 3,
        };
        assert_eq!(
            render_text("f", "\tab", [Finding::from(&diagnostic)], false),
            "warning[X001]: m\n --> f:1:3\n  |\n1 |     ab\n  |      ^\n\n"
        );
        let nowhere = Diagnostic { line: 0, column: 0, ..diagnostic };
        assert_eq!(render_text("f", "", [Finding::from(&nowhere)], false), "warning[X001]: m\n--> f\n\n");
        // A YAML error at the end of the document: after the last line.
        let past_the_end = Diagnostic { line: 2, column: 1, ..nowhere.clone() };
        assert_eq!(
            render_text("f", "a: [\n", [Finding::from(&past_the_end)], false),
            "warning[X001]: m\n --> f:1:5\n  |\n1 | a: [\n  |     ^ the document ends here\n\n"
        );
        let far_past_the_end = Diagnostic { line: 9, column: 1, ..nowhere };
        assert_eq!(
            render_text("f", "a: [\n", [Finding::from(&far_past_the_end)], false),
            "warning[X001]: m\n--> f:9:1\n\n"
        );
    }

    #[test]
    fn json_output_is_one_array_of_findings() {
        let diagnostics = validate_file(
            Path::new("p.yaml"),
            NO_EXECUTOR,
            resolve_kind(Path::new("p.yaml"), NO_EXECUTOR, KindArg::Auto),
        );
        let reports = vec![FileReport { file: "p.yaml".to_owned(), source: NO_EXECUTOR.to_owned(), diagnostics }];
        let value: serde_json::Value = serde_json::from_str(&render_json(&reports)).expect("JSON");
        assert_eq!(
            value,
            serde_json::json!([{
                "file": "p.yaml",
                "severity": "error",
                "code": "EMI002",
                "message": "Roles must include an 'executor' agent",
                "path": "steps[0].roles",
                "line": 7,
                "column": 5,
            }])
        );
        assert_eq!(render_json(&[]), "[]");
    }

    #[test]
    fn roster_files_are_checked_together_as_one_import() {
        let roster = include_str!("../../examples/roster.yaml");
        let auto = |path: &str, source: &str| resolve_kind(Path::new(path), source, KindArg::Auto);
        assert_eq!(auto("roster.yaml", roster), DocumentKind::Roster);
        let reports = validate_files(&[(Path::new("roster.yaml"), roster.to_owned())], KindArg::Auto);
        assert!(!reports[0].diagnostics.iter().any(Diagnostic::is_error), "{:?}", reports[0].diagnostics);

        // An agent of a team that no file defines, at the line and column of its team.
        let broken = "agents:\n  - id: ada\n    team: nowhere\n    role: writer\n";
        let role = "# Writer\n\n## Mission\nWrites.\n";
        let files = [(Path::new("team.yaml"), broken.to_owned()), (Path::new("writer.md"), role.to_owned())];
        let reports = validate_files(&files, KindArg::Auto);
        let missing = reports[0].diagnostics.iter().find(|found| found.code == "ROS007").expect("the missing team");
        assert!(missing.is_error() && missing.message.contains("\"nowhere\""), "{missing:?}");
        assert_eq!((missing.line, missing.column), (3, 11), "{missing:?}");
        // The role is defined by the Markdown file given beside it: no ROS009.
        assert!(!reports[0].diagnostics.iter().any(|found| found.code == "ROS009"), "{:?}", reports[0].diagnostics);
        assert!(reports[1].diagnostics.iter().all(|found| !found.is_error()), "{:?}", reports[1].diagnostics);
    }

    #[test]
    fn kinds_are_detected_from_extension_and_shape() {
        let auto = |path: &str, source: &str| resolve_kind(Path::new(path), source, KindArg::Auto);
        assert_eq!(auto("r.md", "steps: []"), DocumentKind::RoleDefinition);
        assert_eq!(auto("p.yaml", NO_EXECUTOR), DocumentKind::Process);
        assert_eq!(auto("m.yaml", "roles:\n  lead: {can: [x]}\n"), DocumentKind::PermissionMatrix);
        assert_eq!(auto("r.yaml", "name: PythonDeveloper\ntools: [x]\n"), DocumentKind::RoleDefinition);
        assert_eq!(auto("r.yaml", "roles: [a]\n"), DocumentKind::RoleDefinition);
        assert_eq!(resolve_kind(Path::new("x.yaml"), "name: a", KindArg::Matrix), DocumentKind::PermissionMatrix);
        let markdown = validate_file(
            Path::new("r.md"),
            "# A\n## Mission\nm\n",
            resolve_kind(Path::new("r.md"), "# A\n## Mission\nm\n", KindArg::Auto),
        );
        assert_eq!(markdown, vec![]);
    }

    #[test]
    fn exit_codes() {
        assert_eq!(exit_code(false, false), 0);
        assert_eq!(exit_code(false, true), 1);
        assert_eq!(exit_code(true, true), 2);
        assert_eq!(exit_code(true, false), 2);
    }

    #[test]
    fn unreadable_files_exit_with_2_and_valid_files_with_0() {
        let directory = std::env::temp_dir().join(format!("muster-validate-{}", std::process::id()));
        std::fs::create_dir_all(&directory).expect("temporary directory");
        let good = directory.join("good.yaml");
        std::fs::write(&good, "name: p\nsteps:\n  - {id: a, type: human_approval}\n").expect("write");
        let args = |files: Vec<PathBuf>| ValidateArgs { files, format: OutputFormat::Json, kind: KindArg::Auto };
        assert_eq!(run(&args(vec![good.clone()])), ExitCode::from(0));
        assert_eq!(run(&args(vec![good, directory.join("missing.yaml")])), ExitCode::from(2));
        let _ = std::fs::remove_dir_all(&directory);
    }
}
