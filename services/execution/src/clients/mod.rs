//! The services the execution service calls: the roster ([`roster`]:
//! delegation, agents, roles) and the notifier ([`notifier`]: the event
//! stream). Channels connect lazily and reconnect by themselves; calls carry
//! the service's credential and the caller's trace context
//! (`muster_runtime::security`).

pub(crate) mod notifier;
pub(crate) mod roster;
