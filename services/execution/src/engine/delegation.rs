//! A worker hands its step onward: to a named colleague, or to whoever the
//! roster chooses by criteria. Only an agent whose roster entry allows
//! delegation may, and only when the permission matrix lets its role
//! `reassign` (in a session, or outside one when the matrix names its role). The
//! chain of agents the step passed through is tracked, and handing it back
//! to anyone in it is refused as a loop.

use muster_proto::{
    common::v1::EventType,
    execution::v1::{DelegateStep, DelegationOutcome},
    roster::v1 as roster,
};

use super::driver::{Driver, assignment_id};
use crate::domain::{
    StepStatus,
    authority::{self, Subject},
};

impl Driver {
    pub(super) async fn delegate_onward(&mut self, request: DelegateStep) -> DelegationOutcome {
        let refuse = |reason: String, decision: Option<roster::DelegationDecision>| DelegationOutcome {
            assignment_id: request.assignment_id.clone(),
            accepted: false,
            decision,
            reason,
        };
        let Some(position) = self.execution.steps.iter().position(|step| {
            step.status.is_in_flight()
                && assignment_id(&self.execution.id, &step.step_id, step.attempt) == request.assignment_id
        }) else {
            return refuse("the assignment is no longer current".to_owned(), None);
        };
        let current = self.execution.steps[position].executor.clone();
        let step_id = self.execution.steps[position].step_id.clone();
        let chain = self.delegation_chains.get(&position).cloned().unwrap_or_default();
        let mut roster_client = self.engine.roster.clone();
        // The agent's own limit, then its role.
        let roster_role = match roster_client.get_agent(roster::GetAgentRequest { id: current.clone() }).await {
            Ok(response) => match response.into_inner().agent {
                Some(agent) if agent.allow_delegation => agent.role,
                _ => {
                    return refuse(
                        format!("{current} may not hand steps onward: its roster entry does not allow delegation"),
                        None,
                    );
                }
            },
            Err(status) => return refuse(format!("the roster cannot be asked now: {}", status.message()), None),
        };
        let subject = Subject {
            agent_id: &current,
            roster_role: &roster_role,
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
            match roster_client.get_agent(roster::GetAgentRequest { id: target.clone() }).await {
                Ok(_) => (target, None),
                Err(status) if status.code() == tonic::Code::NotFound => {
                    return refuse(format!("colleague '{target}' is not in the roster"), None);
                }
                Err(status) => return refuse(format!("the roster cannot be asked now: {}", status.message()), None),
            }
        } else {
            let mut delegation_chain = chain.clone();
            delegation_chain.push(current.clone());
            let asked = roster_client
                .delegate(roster::DelegateRequest {
                    task_id: format!("{}/{step_id}", self.execution.id),
                    requester_id: current.clone(),
                    required_expertise: request.required_expertise.clone(),
                    required_role: request.required_role.clone(),
                    urgency: roster::Urgency::Normal as i32,
                    delegation_chain,
                    description: request.reason.clone(),
                    ..Default::default()
                })
                .await;
            let decision = match asked {
                Ok(response) => response.into_inner().decision.unwrap_or_default(),
                Err(status) => return refuse(format!("the roster refused: {}", status.message()), None),
            };
            if decision.decision != roster::DecisionKind::Delegate as i32 || decision.primary_agent_id.is_empty() {
                return refuse(
                    format!("the roster found no one to take it now: {}", decision.reasoning),
                    Some(decision),
                );
            }
            (decision.primary_agent_id.clone(), Some(decision))
        };

        // Accepted: the current attempt is withdrawn and the step goes to the target.
        self.engine.workers.withdraw(&request.assignment_id, "delegated onward");
        self.delegation_chains.entry(position).or_default().push(current.clone());
        self.reassigned.insert(position, target.clone());
        let step = &mut self.execution.steps[position];
        step.executor = target.clone();
        step.status = StepStatus::Ready;
        let mut event = self.step_event(EventType::StepDelegated, position);
        event.detail = if request.reason.is_empty() {
            format!("{current} delegated step '{step_id}' to {target}")
        } else {
            format!("{current} delegated step '{step_id}' to {target}: {}", request.reason)
        };
        if let Err(error) = self.persist(&[position], false, vec![event]).await {
            tracing::error!(%error, "recording a delegation failed");
            return refuse("the delegation could not be recorded; the step stays with you".to_owned(), decision);
        }
        DelegationOutcome { assignment_id: request.assignment_id, accepted: true, decision, reason: String::new() }
    }
}
