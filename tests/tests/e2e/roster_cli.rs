//! The roster's views on the command line, against a real cluster on both
//! databases: `muster roster list` with each agent's status and workload,
//! `muster roster show` through the roster's filters as an agent sees the
//! organisation, and `muster roster status` setting an agent offline and
//! back to its derived status.

use muster_tests::{
    Backend, TestCluster,
    command::{run, text},
};

fn words(words: &[&str]) -> Vec<String> {
    words.iter().map(|word| (*word).to_owned()).collect()
}

/// The line of `agent` in a command's output.
fn line_of<'a>(output: &'a str, agent: &str) -> Option<&'a str> {
    output.lines().find(|line| line.split_whitespace().next() == Some(agent))
}

async fn roster_views_on_the_command_line(backend: Backend) {
    let Some(test) = TestCluster::start(backend).await else { return };
    let environment = test.command_environment();
    let imported = run(words(&["roster", "import", "examples/roster.yaml"]), environment.clone()).await;
    assert!(imported.status.success(), "{}", text(&imported));
    let muster = |arguments: &[&str]| run(words(arguments), environment.clone());

    let listed = text(&muster(&["roster", "list"]).await);
    let editor = line_of(&listed, "editor-agent").unwrap_or_else(|| panic!("{listed}"));
    assert!(editor.contains("IDLE") && editor.contains("0/5"), "{editor}");

    let team = muster(&["roster", "show", "--agent", "writer-agent", "--filter", "my-team"]).await;
    let team = text(&team);
    assert!(team.starts_with("you: writer-agent"), "{team}");
    assert!(line_of(&team, "editor-agent").is_some() && line_of(&team, "manager-agent").is_some(), "{team}");
    assert!(line_of(&team, "research-agent").is_none(), "another team's agent in my-team:\n{team}");

    let editing = text(
        &muster(&["roster", "show", "--agent", "writer-agent", "--filter", "by-expertise", "--expertise", "editing"])
            .await,
    );
    assert!(line_of(&editing, "editor-agent").is_some(), "{editing}");
    assert!(line_of(&editing, "seo-agent").is_none(), "{editing}");
    let missing = muster(&["roster", "show", "--agent", "writer-agent", "--filter", "by-expertise"]).await;
    assert!(!missing.status.success() && text(&missing).contains("--expertise"), "{}", text(&missing));

    let offline = muster(&["roster", "status", "editor-agent", "offline"]).await;
    assert!(offline.status.success() && text(&offline).contains("OFFLINE"), "{}", text(&offline));
    let listed = text(&muster(&["roster", "list"]).await);
    assert!(line_of(&listed, "editor-agent").is_some_and(|line| line.contains("OFFLINE")), "{listed}");
    let available = text(&muster(&["roster", "show", "--agent", "writer-agent", "--filter", "available"]).await);
    assert!(line_of(&available, "editor-agent").is_none(), "an offline agent is not available:\n{available}");
    assert!(line_of(&available, "seo-agent").is_some(), "{available}");

    let auto = muster(&["roster", "status", "editor-agent", "auto"]).await;
    assert!(auto.status.success() && text(&auto).contains("IDLE"), "{}", text(&auto));
    let unknown = muster(&["roster", "status", "nobody-agent", "busy"]).await;
    assert!(!unknown.status.success(), "{}", text(&unknown));
    test.shutdown().await;
}

#[tokio::test]
async fn roster_views_on_the_command_line_on_sqlite() {
    roster_views_on_the_command_line(Backend::Sqlite).await;
}

#[tokio::test]
async fn roster_views_on_the_command_line_on_postgres() {
    roster_views_on_the_command_line(Backend::Postgres).await;
}
