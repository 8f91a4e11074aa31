//! The roster: teams, and agents with their status and workload, through the
//! roster's own filters; the delegation audit trail; and "who would take
//! this", a dry-run delegation that shows the roster's decision text.

use std::fmt::Write as _;

use axum::{
    Form,
    extract::{Query, State},
    response::Html,
};
use muster_proto::roster::v1::{
    Agent, DelegateRequest, GetOrganizationRosterRequest, ListAgentsRequest, ListDelegationsRequest, ListTeamsRequest,
    RosterFilter, Urgency,
};

use crate::{
    Shared,
    cluster::{Failure, Signed, check_csrf},
    executions::encode,
    html::{self, escape},
    session::Session,
};

/// Agents, teams and delegations per page.
const PAGE: u32 = 100;

#[derive(Debug, Default, serde::Deserialize)]
pub(crate) struct RosterQuery {
    /// `all`, `my-team`, `available` or `by-expertise`.
    #[serde(default)]
    filter: String,
    #[serde(default)]
    expertise: String,
    /// Whose view (operators; an agent sees its own).
    #[serde(default)]
    agent: String,
    #[serde(default)]
    page: String,
}

const FILTERS: [(&str, &str, RosterFilter); 4] = [
    ("all", "All", RosterFilter::All),
    ("my-team", "My team", RosterFilter::MyTeam),
    ("available", "Available", RosterFilter::Available),
    ("by-expertise", "By expertise", RosterFilter::ByExpertise),
];

/// The roster page.
pub(crate) async fn page(
    State(console): State<Shared>,
    Signed(session): Signed,
    Query(query): Query<RosterQuery>,
) -> Result<Html<String>, Failure> {
    let body = roster_body(&console, &session, &query, "").await?;
    Ok(Html(html::page("Roster", "/roster", Some(&session), &body)))
}

async fn roster_body(
    console: &Shared,
    session: &Session,
    query: &RosterQuery,
    answer: &str,
) -> Result<String, Failure> {
    let mut roster = console.cluster.roster(session)?;
    let viewer = session.agent_id().map_or_else(|| query.agent.trim().to_owned(), str::to_owned);
    let filter =
        FILTERS.iter().find(|(key, ..)| *key == query.filter).map_or(RosterFilter::All, |(.., filter)| *filter);
    let mut body = String::new();
    let _ = write!(
        body,
        "<form class=\"filters\" method=\"get\" action=\"/roster\" role=\"search\">\
         <label for=\"filter\">Show</label> <select id=\"filter\" name=\"filter\">"
    );
    for (key, name, candidate) in FILTERS {
        let selected = if candidate == filter { " selected" } else { "" };
        let _ = write!(body, "<option value=\"{key}\"{selected}>{name}</option>");
    }
    let _ = write!(
        body,
        "</select> <label for=\"expertise\">Expertise</label> <input id=\"expertise\" name=\"expertise\" value=\"{}\">",
        escape(&query.expertise)
    );
    if session.agent_id().is_none() {
        let _ = write!(
            body,
            " <label for=\"agent\">As seen by agent</label> <input id=\"agent\" name=\"agent\" value=\"{}\">",
            escape(&query.agent)
        );
    }
    body.push_str(" <button type=\"submit\">Show</button></form>");

    let (agents, next_page) = if viewer.is_empty() {
        let request = ListAgentsRequest {
            expertise: query.expertise.trim().to_owned(),
            page_size: PAGE,
            page_token: query.page.clone(),
            ..Default::default()
        };
        let answer = roster.list_agents(request).await?.into_inner();
        (answer.agents, answer.next_page_token)
    } else {
        let request = GetOrganizationRosterRequest {
            agent_id: viewer.clone(),
            filter: filter as i32,
            expertise: query.expertise.trim().to_owned(),
        };
        let answer = roster.get_organization_roster(request).await?.into_inner();
        (answer.agent_context.into_iter().chain(answer.colleagues).collect(), String::new())
    };
    body.push_str(&agents_table(&agents, &viewer));
    if !next_page.is_empty() {
        let next = format!("/roster?expertise={}&page={}", encode(&query.expertise), encode(&next_page));
        let _ = write!(body, "<p><a rel=\"next\" href=\"{}\">More agents</a></p>", escape(&next));
    }

    let teams = roster.list_teams(ListTeamsRequest { page_size: PAGE, page_token: String::new() }).await?.into_inner();
    body.push_str("<h2>Teams</h2><div class=\"scroll\" tabindex=\"0\"><table><caption>Teams and their leads</caption><thead><tr><th scope=\"col\">Team</th><th scope=\"col\">Lead</th><th scope=\"col\">Description</th></tr></thead><tbody>");
    for team in &teams.teams {
        let _ = write!(
            body,
            "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&team.name),
            escape(&team.lead_agent_id),
            escape(&team.description)
        );
    }
    body.push_str("</tbody></table></div>");

    let _ = write!(
        body,
        "<h2>Who would take this?</h2><form class=\"delegate\" method=\"post\" action=\"/roster/delegate\">{}\
         <label for=\"task-expertise\">Expertise needed</label> <input id=\"task-expertise\" name=\"expertise\" placeholder=\"research, writing\"> \
         <label for=\"task-role\">Role</label> <input id=\"task-role\" name=\"role\"> \
         <label for=\"urgency\">Urgency</label> <select id=\"urgency\" name=\"urgency\"><option>NORMAL</option><option>LOW</option><option>HIGH</option><option>CRITICAL</option></select> \
         <label for=\"description\">Task</label> <input id=\"description\" name=\"description\"> \
         <button type=\"submit\">Ask the roster</button></form>{answer}",
        html::csrf_field(session)
    );

    let delegations = ListDelegationsRequest { agent_id: viewer.clone(), limit: 50, ..Default::default() };
    match roster.list_delegations(delegations).await {
        Ok(answer) => {
            body.push_str("<h2>Delegations</h2><div class=\"scroll\" tabindex=\"0\"><table><caption>The roster's decisions, newest first</caption><thead><tr><th scope=\"col\">When</th><th scope=\"col\">Task</th><th scope=\"col\">Asked by</th><th scope=\"col\">Decision</th></tr></thead><tbody>");
            for record in answer.into_inner().records {
                let decision = record.decision.unwrap_or_default();
                let _ = write!(
                    body,
                    "<tr><td>{}</td><td>{}</td><td>{}</td><td class=\"decision\">{}</td></tr>",
                    record.decided_at.map(|at| at.to_string()).unwrap_or_default(),
                    escape(&record.task_id),
                    escape(&record.requester_id),
                    escape(&decision.text)
                );
            }
            body.push_str("</tbody></table></div>");
        }
        Err(status) => {
            body.push_str(&html::notice("info", &format!("The delegations are not shown: {}", status.message())))
        }
    }
    Ok(body)
}

fn agents_table(agents: &[Agent], viewer: &str) -> String {
    let mut table = String::from(
        "<div class=\"scroll\" tabindex=\"0\"><table class=\"agents\"><caption>Agents</caption><thead><tr><th scope=\"col\">Agent</th><th scope=\"col\">Role</th>\
         <th scope=\"col\">Team</th><th scope=\"col\">Expertise</th><th scope=\"col\">Status</th><th scope=\"col\">Workload</th></tr></thead><tbody>",
    );
    for agent in agents {
        let status = agent.status().as_str_name().trim_start_matches("AGENT_STATUS_").to_owned();
        let you = if agent.id == viewer { " (you)" } else { "" };
        let _ = write!(
            table,
            "<tr><td>{id}{you}</td><td>{role}</td><td>{team}</td><td>{expertise}</td>\
             <td><span class=\"status {lower}\">{status}</span></td><td>{load}/{capacity}</td></tr>",
            id = escape(&agent.id),
            role = escape(&agent.role),
            team = escape(&agent.team),
            expertise = escape(&agent.expertise.join(", ")),
            lower = status.to_ascii_lowercase(),
            load = agent.current_workload,
            capacity = agent.workload_capacity,
        );
    }
    table.push_str("</tbody></table></div>");
    table
}

#[derive(Debug, serde::Deserialize)]
pub(crate) struct DryRun {
    csrf: String,
    #[serde(default)]
    expertise: String,
    #[serde(default)]
    role: String,
    #[serde(default)]
    urgency: String,
    #[serde(default)]
    description: String,
}

/// Asks the roster who would take a task, without taking anyone's slot.
pub(crate) async fn dry_run(
    State(console): State<Shared>,
    Signed(session): Signed,
    Form(form): Form<DryRun>,
) -> Result<Html<String>, Failure> {
    check_csrf(&session, &form.csrf)?;
    let request = DelegateRequest {
        task_id: "console-dry-run".to_owned(),
        requester_id: session.agent_id().unwrap_or_default().to_owned(),
        required_expertise: form
            .expertise
            .split(',')
            .map(str::trim)
            .filter(|item| !item.is_empty())
            .map(str::to_owned)
            .collect(),
        required_role: form.role.trim().to_owned(),
        urgency: Urgency::from_str_name(&format!("URGENCY_{}", form.urgency.trim())).unwrap_or(Urgency::Normal) as i32,
        description: form.description,
        dry_run: true,
        ..Default::default()
    };
    let answer = match console.cluster.roster(&session)?.delegate(request).await {
        Ok(answer) => {
            let decision = answer.into_inner().decision.unwrap_or_default();
            format!(
                "<h3>The roster's answer</h3><pre class=\"decision\" id=\"decision\">{}</pre>",
                escape(&decision.text)
            )
        }
        Err(status) => html::notice("error", &format!("{:?}: {}", status.code(), status.message())),
    };
    let body = roster_body(&console, &session, &RosterQuery::default(), &answer).await?;
    Ok(Html(html::page("Roster", "/roster", Some(&session), &body)))
}
