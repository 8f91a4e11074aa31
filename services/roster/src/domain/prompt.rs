//! An agent's system prompt: the agent's own prompt and its backstory ("Your
//! background:"), its role (mission, goals, tools, context files, user
//! preferences) with the think-first preamble, then its static
//! organisational context and the delegation framework. Live data
//! (colleagues, their status and workload) stays out: agents query the
//! roster for it.

use super::model::{Agent, RoleDefinition};

/// The delegation framework every agent's prompt carries.
pub const DELEGATION_FRAMEWORK: &str = "\
Before delegating, get a fresh roster with the `get_organization_roster` tool
(filters: all, my_team, available, by_expertise). Never rely on remembered
status or workload: it changes all the time.

Priority order:
1. Best same-team match: same team, required expertise, available (idle or
   active), workload below capacity, not offline.
2. Partial expertise, same team: related expertise, available, below capacity;
   they can learn with guidance.
3. Best cross-team match: another team, required expertise, available, below
   capacity. Note the coordination overhead.
4. Queue for the primary expert: the expert is busy (at capacity) but not
   offline, and the estimated wait fits the task's urgency. Say the wait.
   An urgent task (high or critical) does not wait: it goes to the expert at
   capacity in one slot over capacity (5/5 becomes 6/5, never more). Say so.
5. Escalate to your manager: no suitable colleague, all experts offline, or a
   critical task that cannot wait.

Rules:
- Delegate downwards or sideways; respect the hierarchy.
- Never delegate to an offline colleague, nor to one at capacity unless the
  task is urgent; never to one already over capacity.
- Never delegate a task back to an agent it came from (delegation loops).
- Workload below 4/5 is good capacity, 4/5 is approaching capacity, 5/5 is at
  capacity (only urgent tasks, one at a time: 6/5 at most).

Error handling:
- Colleague not in the roster: \"This colleague doesn't exist in my roster.
  Escalating to manager.\"
- Colleague offline: queue the task or escalate, depending on urgency.
- No suitable expertise: escalate to your manager for guidance.
- Delegation loop: \"This task was delegated to me by {original_agent}. I should
  not delegate back. Escalating.\"

Format every delegation decision as:

DELEGATION DECISION:
Primary Choice: {name} ({reason})
Fallback: {backup} ({reason}) [if applicable]
Decision: DELEGATE | QUEUE | ESCALATE
Reasoning: {1-2 sentence explanation}
Wait Time: {if queuing}
Notes: {special context}
";

/// What every role's prompt asks before the agent acts.
pub const THINK_FIRST: &str = "\
Before taking any action, THINK:
1. What has changed since the last run? (check inbox, compare context)
2. What needs attention right now?
3. What is the most valuable action you can take this run?

Then act on your reasoning. Be efficient — do only what matters, then stop.
";

/// Renders an agent's system prompt. `role` is the definition of the agent's
/// role and `senior` the agent's senior, when they exist.
pub fn render_system_prompt(agent: &Agent, role: Option<&RoleDefinition>, senior: Option<&Agent>) -> String {
    let mut prompt = String::new();
    let custom = agent.custom_prompt.trim();
    if !custom.is_empty() {
        prompt.push_str(custom);
        prompt.push_str("\n\n");
    }
    let backstory = agent.backstory.trim();
    if !backstory.is_empty() {
        prompt.push_str("Your background:\n");
        prompt.push_str(backstory);
        prompt.push_str("\n\n");
    }
    if let Some(role) = role {
        render_role(&mut prompt, role);
    }
    let or_none = |text: &str| if text.is_empty() { "(none)".to_owned() } else { text.to_owned() };
    let manager = match (senior, agent.senior_id.is_empty()) {
        (Some(senior), _) => format!("{} (ID: {})", senior.name, senior.id),
        (None, true) => "(none; you are at the top of the hierarchy)".to_owned(),
        (None, false) => format!("(unknown) (ID: {})", agent.senior_id),
    };
    let expertise = if agent.expertise.is_empty() { "(none listed)".to_owned() } else { agent.expertise.join(", ") };
    prompt.push_str("## YOUR ORGANIZATIONAL CONTEXT\n\n");
    prompt.push_str(&format!("You are: {}\n", agent.name));
    prompt.push_str(&format!("Role: {}\n", or_none(&agent.role)));
    prompt.push_str(&format!("Team: {}\n", or_none(&agent.team)));
    prompt.push_str(&format!("Your Manager: {manager}\n"));
    prompt.push_str(&format!(
        "Current Workload: {}/{} tasks (when this prompt was rendered; query the roster for fresh data)\n",
        agent.current_workload, agent.workload_capacity
    ));
    prompt.push_str(&format!("Your Expertise: {expertise}\n"));
    if !agent.allow_delegation {
        prompt.push_str("You may not delegate onward: do the task yourself or escalate to your manager.\n");
    }
    prompt.push_str("\n## DELEGATION FRAMEWORK\n\n");
    prompt.push_str(DELEGATION_FRAMEWORK);
    prompt
}

/// The role part: who the agent is in this project, what it may use, and
/// the think-first preamble.
fn render_role(prompt: &mut String, role: &RoleDefinition) {
    let list = |items: &[String]| items.iter().map(|item| format!("- {item}\n")).collect::<String>();
    prompt.push_str("## YOUR ROLE\n\n");
    match role.description.trim() {
        "" => prompt.push_str(&format!("Your role in this project: {}.\n", role.name)),
        description => prompt.push_str(&format!("Your role in this project: {} ({description}).\n", role.name)),
    }
    if !role.mission.trim().is_empty() {
        prompt.push_str(&format!("Your mission: {}\n", role.mission.trim()));
    }
    if !role.goals.is_empty() {
        prompt.push_str(&format!("Your goals:\n{}", list(&role.goals)));
    }
    if !role.responsibilities.is_empty() {
        prompt.push_str(&format!("Your responsibilities:\n{}", list(&role.responsibilities)));
    }
    if role.tools.is_empty() {
        prompt.push_str("Tools: none; do not call any.\n");
    } else {
        prompt.push_str(&format!("Tools (use only these):\n{}", list(&role.tools)));
    }
    if !role.context_files.is_empty() {
        prompt.push_str(&format!("Context files (load only these):\n{}", list(&role.context_files)));
    }
    if !role.user_preferences.trim().is_empty() {
        prompt.push_str(&format!("User preferences: {}\n", role.user_preferences.trim()));
    }
    prompt.push('\n');
    prompt.push_str(THINK_FIRST);
    prompt.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent() -> Agent {
        Agent {
            id: "delivery-agent".into(),
            name: "Dana".into(),
            role: "delivery".into(),
            custom_prompt: "Be concise.".into(),
            workload_capacity: 5,
            allow_delegation: true,
            ..Agent::default()
        }
    }

    #[test]
    fn a_role_brings_its_mission_tools_and_the_think_first_preamble() {
        let role = RoleDefinition {
            name: "delivery".into(),
            description: "Delivery Manager".into(),
            mission: "Keep delivery on time.".into(),
            goals: vec!["Track progress".into(), "Find blockers".into()],
            tools: vec!["read_file".into()],
            context_files: vec!["project/timeline.md".into()],
            user_preferences: "Short bullet points.".into(),
            ..RoleDefinition::default()
        };
        let prompt = render_system_prompt(&agent(), Some(&role), None);
        let expected = "Be concise.\n\n## YOUR ROLE\n\nYour role in this project: delivery (Delivery Manager).\n\
                        Your mission: Keep delivery on time.\nYour goals:\n- Track progress\n- Find blockers\n\
                        Tools (use only these):\n- read_file\nContext files (load only these):\n\
                        - project/timeline.md\nUser preferences: Short bullet points.\n\n";
        assert!(prompt.starts_with(expected), "{prompt}");
        let think = prompt.find("Before taking any action, THINK:").expect("the preamble");
        let context = prompt.find("## YOUR ORGANIZATIONAL CONTEXT").expect("the organisation");
        assert!(think < context, "the role comes before the organisation");
    }

    #[test]
    fn the_backstory_follows_the_agents_own_prompt() {
        let storied = Agent { backstory: "  Ten years of shipping on time.\n".into(), ..agent() };
        let prompt = render_system_prompt(&storied, None, None);
        assert!(
            prompt.starts_with(
                "Be concise.\n\nYour background:\nTen years of shipping on time.\n\n## YOUR ORGANIZATIONAL CONTEXT"
            ),
            "{prompt}"
        );
        let prompt = render_system_prompt(&Agent { backstory: " \n".into(), ..agent() }, None, None);
        assert!(!prompt.contains("Your background"), "an empty backstory is left out: {prompt}");
    }

    #[test]
    fn without_a_role_there_is_no_role_section() {
        let prompt = render_system_prompt(&agent(), None, None);
        assert!(!prompt.contains("YOUR ROLE") && !prompt.contains("THINK"), "{prompt}");
        assert!(prompt.starts_with("Be concise.\n\n## YOUR ORGANIZATIONAL CONTEXT"), "{prompt}");
    }
}
