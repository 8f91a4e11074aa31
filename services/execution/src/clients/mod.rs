//! The services the execution service calls: the roster ([`roster`]:
//! delegation, agents, roles; its delegations and releases batched across
//! executions by [`batched`], and sent on one stream by [`placements`]) and
//! the notifier ([`notifier`]: the event
//! stream). Channels connect lazily and reconnect by themselves; calls carry
//! the service's credential and the caller's trace context
//! (`muster_runtime::security`).

pub(crate) mod batched;
pub(crate) mod notifier;
mod placements;
pub(crate) mod roster;
