//! What agents' sessions tell the controller (`Event`, routed by the hub to
//! the run holding the agent) and the way back to one agent (`ToAgent`, a
//! bounded queue of its own). Shared by the gRPC service, the hub, agent
//! sources and schedulers; depends on none of them.

use std::pin::Pin;

use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use pgfleet_proto::v1::agent_message::Msg;
use pgfleet_proto::v1::{ControllerMessage, Register};

/// The stream of one agent's session, server to agent.
pub type OutStream = Pin<Box<dyn Stream<Item = Result<ControllerMessage, Status>> + Send>>;

/// How many messages wait for one agent before it counts as stuck.
pub const AGENT_QUEUE: usize = 256;

/// The way to one agent's session: a bounded queue of its own. Sending
/// never waits: an agent that does not read its messages fills its queue,
/// and a full queue ends that session (the agent reconnects and
/// re-registers), so one stuck agent never holds up the others.
#[derive(Debug, Clone)]
pub struct ToAgent {
    tx: mpsc::Sender<Result<ControllerMessage, Status>>,
    close: tokio_util::sync::CancellationToken,
}

impl ToAgent {
    /// A queue and the stream that carries it to the agent (it ends when the
    /// queue overflows).
    pub fn channel() -> (ToAgent, OutStream) {
        let (tx, rx) = mpsc::channel(AGENT_QUEUE);
        let close = tokio_util::sync::CancellationToken::new();
        let stream = ReceiverStream::new(rx).take_until(close.clone().cancelled_owned());
        (ToAgent { tx, close }, Box::pin(stream))
    }

    /// Queues `msg`; false when it was not (the session is gone, or its
    /// queue was full, which ends the session).
    pub fn send(&self, msg: ControllerMessage) -> bool {
        match self.tx.try_send(Ok(msg)) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                tracing::warn!(
                    "an agent left {AGENT_QUEUE} messages unread: ending its session (it reconnects)"
                );
                self.close.cancel();
                false
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
    }

    /// Whether the session it leads to has ended.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed() || self.close.is_cancelled()
    }
}

#[derive(Debug)]
pub enum Event {
    Registered {
        info: Register,
        conn: u64,
        tx: ToAgent,
    },
    Message {
        agent_id: String,
        conn: u64,
        msg: Msg,
        /// When it arrived (the scheduler measures how long it waited).
        received: std::time::Instant,
    },
    Disconnected {
        agent_id: String,
        conn: u64,
    },
    /// From an agent source: the agent is gone for good (its process
    /// exited, its pod failed, was evicted or deleted, or never started).
    /// It is lost at once, whatever its state; `why` says what happened.
    Gone {
        agent_id: String,
        why: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    fn hb() -> ControllerMessage {
        ControllerMessage { msg: None }
    }

    #[tokio::test]
    async fn a_full_queue_ends_that_session_and_never_waits() {
        let (tx, mut out) = ToAgent::channel();
        for _ in 0..AGENT_QUEUE {
            assert!(tx.send(hb()));
        }
        // The agent reads nothing: the next message is refused at once and
        // the session's stream ends.
        assert!(!tx.send(hb()));
        assert!(tx.is_closed());
        assert!(
            out.next().await.is_none(),
            "the stream goes on after an overflow"
        );
    }

    #[tokio::test]
    async fn a_reading_agent_gets_everything_in_order() {
        let (tx, mut out) = ToAgent::channel();
        for i in 0..(3 * AGENT_QUEUE) {
            let msg = ControllerMessage {
                msg: Some(pgfleet_proto::v1::controller_message::Msg::ResultAck(
                    pgfleet_proto::v1::ResultAck {
                        cell_id: i.to_string(),
                    },
                )),
            };
            assert!(tx.send(msg));
            let got = out.next().await.unwrap().unwrap();
            assert!(
                matches!(got.msg, Some(pgfleet_proto::v1::controller_message::Msg::ResultAck(a)) if a.cell_id == i.to_string())
            );
        }
    }
}
