//! The gRPC side of agent sessions. Each session becomes events for the
//! scheduler: `Registered` (with a sender for messages to the agent),
//! `Message`, and `Disconnected`. The service itself keeps no state.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::Stream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::{Request, Response, Status, Streaming};

use pgfleet_proto::v1::agent_message::Msg;
use pgfleet_proto::v1::agent_session_server::{AgentSession, AgentSessionServer};
use pgfleet_proto::v1::{
    AgentMessage, ControllerMessage, Register, Registered, controller_message,
};

use crate::{Error, Result};

pub type ToAgent = mpsc::Sender<Result<ControllerMessage, Status>>;

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
    },
    Disconnected {
        agent_id: String,
        conn: u64,
    },
    /// From an agent source: the agent process ended.
    Exited {
        agent_id: String,
        status: String,
    },
}

pub struct SessionService {
    events: mpsc::Sender<Event>,
    lease: Duration,
    next_conn: AtomicU64,
}

impl SessionService {
    pub fn new(events: mpsc::Sender<Event>, lease: Duration) -> Self {
        SessionService {
            events,
            lease,
            next_conn: AtomicU64::new(1),
        }
    }
}

type OutStream = Pin<Box<dyn Stream<Item = Result<ControllerMessage, Status>> + Send>>;

#[tonic::async_trait]
impl AgentSession for SessionService {
    type SessionStream = OutStream;

    async fn session(
        &self,
        req: Request<Streaming<AgentMessage>>,
    ) -> Result<Response<OutStream>, Status> {
        let mut inbound = req.into_inner();
        let info = match inbound.message().await? {
            Some(AgentMessage {
                msg: Some(Msg::Register(r)),
            }) => r,
            _ => {
                return Err(Status::invalid_argument(
                    "the first message of a session must be `register`",
                ));
            }
        };
        if info.agent_id.is_empty() || info.instance_class.is_empty() {
            return Err(Status::invalid_argument(
                "register: agent_id and instance_class are required",
            ));
        }
        let conn = self.next_conn.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(256);
        let heartbeat = (self.lease / 5).max(Duration::from_millis(100));
        let _ = tx
            .send(Ok(ControllerMessage {
                msg: Some(controller_message::Msg::Registered(Registered {
                    heartbeat_interval_ms: heartbeat.as_millis() as u32,
                    lease_ms: self.lease.as_millis() as u32,
                })),
            }))
            .await;
        let agent_id = info.agent_id.clone();
        self.events
            .send(Event::Registered { info, conn, tx })
            .await
            .map_err(|_| Status::unavailable("controller is shutting down"))?;
        let events = self.events.clone();
        tokio::spawn(async move {
            loop {
                match inbound.message().await {
                    Ok(Some(AgentMessage { msg: Some(msg) })) => {
                        if events
                            .send(Event::Message {
                                agent_id: agent_id.clone(),
                                conn,
                                msg,
                            })
                            .await
                            .is_err()
                        {
                            break;
                        }
                    }
                    Ok(Some(_)) => {}
                    Ok(None) | Err(_) => break,
                }
            }
            let _ = events.send(Event::Disconnected { agent_id, conn }).await;
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// A running gRPC server; dropping the handle does not stop it, `shutdown` does.
pub struct Server {
    pub addr: SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    pub async fn shutdown(self) {
        let _ = self.stop.send(());
        let _ = tokio::time::timeout(Duration::from_secs(5), self.task).await;
    }
}

/// Serves agent sessions on `bind` (port 0 picks a free port).
pub async fn serve(
    bind: SocketAddr,
    events: mpsc::Sender<Event>,
    lease: Duration,
) -> Result<Server> {
    let listener = tokio::net::TcpListener::bind(bind)
        .await
        .map_err(|e| Error::Server(format!("binding {bind}: {e}")))?;
    let addr = listener
        .local_addr()
        .map_err(|e| Error::Server(e.to_string()))?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let svc = AgentSessionServer::new(SessionService::new(events, lease));
    let task = tokio::spawn(async move {
        let r = tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(Duration::from_secs(5)))
            .add_service(svc)
            .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                let _ = stopped.await;
            })
            .await;
        if let Err(e) = r {
            tracing::error!(error = %e, "gRPC server ended");
        }
    });
    Ok(Server { addr, stop, task })
}
