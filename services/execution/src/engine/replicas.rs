//! The replicas on one database: joining them with a lease, keeping it,
//! taking over the executions of a replica whose lease lapsed or that left,
//! and stopping when this one's own lapses.

use std::sync::Arc;

use super::Engine;
use crate::{Result, domain::model::Step, store::Replica};

impl Engine {
    /// Joins the replicas on the store, with this replica's lease; the
    /// others reach it at `url` (empty: they cannot), connecting to
    /// `address` when the URL's host names a Service rather than this replica.
    pub(crate) async fn join(&self, url: &str, address: &str) -> Result<()> {
        let me = Replica { id: self.replica.clone(), url: url.to_owned(), address: address.to_owned() };
        self.store.join(&me, self.settings.ownership_lease).await?;
        self.joined.store(true, std::sync::atomic::Ordering::Release);
        tracing::info!(replica = %self.replica, lease_ms = self.settings.ownership_lease.as_millis() as u64, "joined the execution service's replicas");
        Ok(())
    }

    /// Renews this replica's lease every third of it, until the engine
    /// stops. When the lease is lost (it lapsed: another replica may drive
    /// the executions now), or cannot be renewed before it lapses, cancels
    /// [`Engine::deposed`]. Nothing else waits in this loop: a long takeover
    /// ([`Engine::adopt_orphans`]) never makes a renewal late.
    pub(crate) async fn keep_lease(self: Arc<Self>) {
        let lease = self.settings.ownership_lease;
        let mut tick = tokio::time::interval(lease / 3);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Measured from before each renewal asks, so never later than the
        // database's own expiry.
        let mut held_until = tokio::time::Instant::now() + lease;
        loop {
            tick.tick().await;
            let asked = tokio::time::Instant::now();
            // A database that does not answer (a cut network) is waited
            // for only until the lease lapses.
            match tokio::time::timeout_at(held_until, self.store.renew(lease)).await {
                Ok(Ok(true)) => held_until = asked + lease,
                Ok(Ok(false)) => return self.depose("its lease lapsed"),
                Err(_) => return self.depose("the database did not answer before its lease lapsed"),
                Ok(Err(error)) if tokio::time::Instant::now() >= held_until => {
                    return self.depose(&format!("it could not renew its lease in time: {error}"));
                }
                Ok(Err(error)) => tracing::warn!(%error, "renewing this replica's lease failed; retrying"),
            }
        }
    }

    /// Takes over the executions no replica drives, every third of the
    /// lease, until the engine stops.
    pub(crate) async fn adopt_orphans(self: Arc<Self>) {
        let period = self.settings.ownership_lease / 3;
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            match self.adopt().await {
                Ok(0) => {}
                Ok(adopted) => tracing::info!(adopted, "took over executions no replica drove"),
                Err(error) => tracing::warn!(%error, "taking over executions no replica drives failed"),
            }
        }
    }

    fn depose(&self, why: &str) {
        tracing::error!(replica = %self.replica, "this replica no longer drives its executions ({why}); stopping");
        self.deposed.cancel();
    }

    /// Takes over and resumes the unfinished executions that no replica
    /// drives (given back by a replica that stopped, or of one whose lease
    /// lapsed); how many.
    pub(crate) async fn adopt(self: &Arc<Self>) -> Result<usize> {
        let ids = self.store.adopt().await?;
        let mut resumed = 0;
        for id in &ids {
            if self.drives(id) {
                continue;
            }
            let Some(mut execution) = self.store.execution(id).await? else { continue };
            execution.last_sequence = self.store.last_event_sequence(id).await?;
            let process = match self.definition_of(&execution).await {
                Ok(process) => process,
                Err(error) => {
                    tracing::error!(execution_id = %id, %error, "the process version of an unfinished execution cannot be read");
                    continue;
                }
            };
            let steps: Vec<Step> = self.store.steps(id).await?.into_iter().map(|(_, step)| step).collect();
            if steps.len() != process.definition.steps.len() {
                tracing::error!(execution_id = %id, "the stored steps do not match the process version; not resumed");
                continue;
            }
            tracing::info!(execution_id = %id, "resuming execution");
            self.spawn_driver(execution, steps, process, None);
            resumed += 1;
        }
        Ok(resumed)
    }
}

/// This incarnation's name among the replicas, with a random suffix so that
/// a restarted process is a new incarnation: `IDENTITY@SUFFIX` for a stable
/// identity (the store knows the previous incarnations by it), else
/// `HOST-SUFFIX` (a pod's name on Kubernetes).
pub(super) fn replica_name(identity: &str) -> String {
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    if !identity.is_empty() {
        return format!("{identity}{}{}", crate::store::INCARNATION, &suffix[..8]);
    }
    let host = std::env::var("HOSTNAME").ok().filter(|host| !host.is_empty()).unwrap_or_else(|| "execution".to_owned());
    format!("{host}-{}", &suffix[..8])
}
