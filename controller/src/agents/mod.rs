//! Where agents come from. A source starts agents for the fleet and later
//! stops them and cleans up after them; the agents then dial the controller
//! and register like any other. The scheduler only learns which agent ids to
//! expect, so a Kubernetes source (pods pinned to node pools, volumes from
//! the storage class under test) slots in beside `local` without touching it.

use futures::future::BoxFuture;

pub mod kubernetes;
pub mod local;

/// One agent a source launched.
#[derive(Debug, Clone)]
pub struct Launched {
    pub agent_id: String,
    pub instance_class: String,
}

pub trait AgentSource: Send {
    /// The agents launched, for the scheduler to expect.
    fn launched(&self) -> Vec<Launched>;
    /// Waits for agents to exit after the controller told them to shut down
    /// (bounded), stops the rest, and removes everything they left.
    fn shutdown(&mut self) -> BoxFuture<'_, ()>;
    /// `shutdown` at the run's end, by the scenario's `cleanup:` where the
    /// source keeps anything: what it kept, for the report (none here).
    fn finish(&mut self, succeeded: bool) -> BoxFuture<'_, Option<serde_json::Value>> {
        let _ = succeeded;
        let f = self.shutdown();
        Box::pin(async move {
            f.await;
            None
        })
    }
}
