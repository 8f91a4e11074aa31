//! A worker hands its step onward: to a named colleague, or to whoever the
//! roster chooses by criteria. Only an agent whose roster entry allows
//! delegation may, and only when the permission matrix lets its role
//! `reassign` (in a session, or outside one when the matrix names its role).
//! The chain of agents the step passed through is kept with the step, and
//! handing it back to anyone in it is refused as a loop.

use super::driver::Driver;
use crate::{
    clients::roster::DelegationAsk,
    domain::{
        StepStatus,
        authority::{self, Subject},
        model::{Decision, DecisionKind, EventKind, HandOff, HandOffAnswer},
    },
};

impl Driver {
    pub(super) async fn hand_off(&mut self, request: HandOff) -> HandOffAnswer {
        let refuse = |reason: String, decision: Option<Decision>| HandOffAnswer {
            assignment_id: request.assignment_id.clone(),
            accepted: false,
            decision,
            reason,
        };
        let Some(position) = (0..self.steps.len()).find(|&position| {
            self.steps[position].status == StepStatus::Running && self.assignment_id(position) == request.assignment_id
        }) else {
            return refuse("the assignment is no longer current".to_owned(), None);
        };
        let current = self.steps[position].executor.clone();
        let step_id = self.definition(position).id.clone();
        let chain = self.steps[position].delegation_chain.clone();
        let roster = self.engine.roster.clone();
        // The agent's own limit, then its role.
        let agent = match roster.agent(current.clone()).await {
            Ok(agent) if agent.allow_delegation => agent,
            Ok(_) => {
                return refuse(
                    format!("{current} may not hand steps onward: its roster entry does not allow delegation"),
                    None,
                );
            }
            Err(failure) => return refuse(format!("the roster cannot be asked now: {}", failure.message()), None),
        };
        // Outside sessions the actions its roster role lists bind it too.
        let grants = if self.execution.session.is_none() && !agent.role.is_empty() {
            match roster.role_grants(agent.role.clone()).await {
                Ok(grants) => grants,
                Err(failure) => {
                    return refuse(format!("the roster cannot be asked now: {}", failure.message()), None);
                }
            }
        } else {
            Default::default()
        };
        let subject = Subject {
            agent_id: &current,
            roster_role: &agent.role,
            roster_actions: Some(grants.actions.as_slice()),
            lead: &self.execution.lead_agent_id,
            session: self.execution.session.as_ref(),
        };
        let verdict = authority::check(&self.engine.matrix(), &subject, "reassign");
        if !verdict.allowed {
            return refuse(format!("{current} may not hand the step onward: {}", verdict.reason), None);
        }
        let (target, decision) = if !request.to_agent_id.is_empty() {
            let target = request.to_agent_id.clone();
            if target == current || chain.contains(&target) {
                let path: Vec<&str> =
                    chain.iter().map(String::as_str).chain([current.as_str(), target.as_str()]).collect();
                return refuse(format!("delegation loop: {}; the step stays with {current}", path.join(" -> ")), None);
            }
            if let Err(failure) = roster.agent(target.clone()).await {
                return refuse(
                    match failure {
                        crate::clients::roster::RosterFailure::NotFound(_) => {
                            format!("colleague '{target}' is not in the roster")
                        }
                        other => format!("the roster cannot be asked now: {}", other.message()),
                    },
                    None,
                );
            }
            (target, None)
        } else {
            let mut delegation_chain = chain.clone();
            delegation_chain.push(current.clone());
            let asked = roster
                .delegate(DelegationAsk {
                    task_id: self.task_id(position),
                    requester_id: current.clone(),
                    required_expertise: request.required_expertise.clone(),
                    required_role: request.required_role.clone(),
                    urgency: "normal".to_owned(),
                    delegation_chain,
                    description: request.reason.clone(),
                    ..DelegationAsk::default()
                })
                .await;
            let decision = match asked {
                Ok(decision) => decision,
                Err(failure) => return refuse(format!("the roster refused: {}", failure.message()), None),
            };
            if decision.kind != DecisionKind::Delegate || decision.primary_agent_id.is_empty() {
                return refuse(
                    format!("the roster found no one to take it now: {}", decision.reasoning),
                    Some(decision),
                );
            }
            (decision.primary_agent_id.clone(), Some(decision))
        };

        // Accepted: the current attempt is withdrawn and the step goes to the
        // target. The task keeps its roster slot: a decision by criteria
        // moved it to the target already; for a named target, the step's
        // next start asks the roster about it, which moves the slot when the
        // target has room, or queues the step for it.
        self.withdraw_attempt(position, "delegated onward");
        if decision.is_some() {
            // The decision was about the step's own task: a slot it took over
            // from the step before it goes back.
            if !self.steps[position].slot_task.is_empty() {
                self.release_delegation(position);
            }
            self.steps[position].roster_reserved = true;
        }
        let step = &mut self.steps[position];
        step.delegation_chain.push(current.clone());
        step.assigned_to = Some(target.clone());
        step.executor = target.clone();
        self.set_status(position, StepStatus::Ready);
        self.reopened_ready(position);
        let mut event = self.step_event(EventKind::StepDelegated, position);
        event.detail = if request.reason.is_empty() {
            format!("{current} delegated step '{step_id}' to {target}")
        } else {
            format!("{current} delegated step '{step_id}' to {target}: {}", request.reason)
        };
        self.record(event);
        HandOffAnswer { assignment_id: request.assignment_id, accepted: true, decision, reason: String::new() }
    }
}
