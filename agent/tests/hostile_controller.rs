//! The agent against a controller that sends what no pgfleet controller
//! would: a test gRPC server (the real session protocol, on loopback)
//! assigns cells whose id climbs out of the data root, whose sizes exceed
//! what validation allows, whose counts are negative, and whose settings
//! run commands. The real `pgfleet-agent` binary refuses each with a clear
//! result and touches nothing outside its data root.

use std::path::PathBuf;
use std::pin::Pin;
use std::process::Stdio;
use std::time::Duration;

use futures::Stream;
use pgfleet_proto::v1::agent_message::Msg;
use pgfleet_proto::v1::agent_session_server::{AgentSession, AgentSessionServer};
use pgfleet_proto::v1::controller_message::Msg as CMsg;
use pgfleet_proto::v1::{
    AgentMessage, Assign, CellResult, CellStatus, ControllerMessage, Registered, ResultAck,
    Shutdown,
};
use tokio::sync::mpsc;
use tonic::{Request, Response, Status, Streaming};

type Out = Pin<Box<dyn Stream<Item = Result<ControllerMessage, Status>> + Send>>;

/// Sends `assigns` after the registration, acknowledges each result,
/// hands the results to the test and shuts the agent down after the last.
struct Hostile {
    assigns: Vec<Assign>,
    results: mpsc::Sender<CellResult>,
}

#[tonic::async_trait]
impl AgentSession for Hostile {
    type SessionStream = Out;

    async fn session(
        &self,
        req: Request<Streaming<AgentMessage>>,
    ) -> Result<Response<Out>, Status> {
        let mut inbound = req.into_inner();
        let (tx, rx) = mpsc::channel(64);
        let (assigns, results) = (self.assigns.clone(), self.results.clone());
        tokio::spawn(async move {
            let send = |m: CMsg| {
                let tx = tx.clone();
                async move { tx.send(Ok(ControllerMessage { msg: Some(m) })).await }
            };
            let Ok(Some(AgentMessage {
                msg: Some(Msg::Register(_)),
            })) = inbound.message().await
            else {
                return;
            };
            let _ = send(CMsg::Registered(Registered {
                heartbeat_interval_ms: 500,
                lease_ms: 10_000,
            }))
            .await;
            let total = assigns.len();
            for a in assigns {
                let _ = send(CMsg::Assign(a)).await;
            }
            let mut seen = 0;
            while let Ok(Some(m)) = inbound.message().await {
                if let Some(Msg::Result(r)) = m.msg {
                    let _ = send(CMsg::ResultAck(ResultAck {
                        cell_id: r.cell_id.clone(),
                    }))
                    .await;
                    let _ = results.send(r).await;
                    seen += 1;
                    if seen == total {
                        let _ = send(CMsg::Shutdown(Shutdown {
                            reason: "test over".into(),
                            refused: false,
                        }))
                        .await;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}

fn assign(cell: &str, workload: &str, params: serde_json::Value) -> Assign {
    Assign {
        cell_id: cell.into(),
        run_id: "hostile-1".into(),
        workload: workload.into(),
        params_json: params.to_string(),
        ..Default::default()
    }
}

fn init(scale: i64, partitions: i64) -> serde_json::Value {
    serde_json::json!({"scale": scale, "fillfactor": 100, "partitions": partitions, "load_connections": 1})
}

/// A pgbench cell whose script's expression is 3,000 parentheses deep.
fn deep_script() -> Assign {
    let p = pgfleet_proto::workload::plan_entry(
        "{kind: pgbench, scale: 1, script_text: \"\\\\set x 1\\nSELECT :x;\", transactions: 1}",
    )
    .unwrap()
    .remove(0)
    .1;
    let deep = format!("{}1{}", "(".repeat(3000), ")".repeat(3000));
    let json = p
        .to_json()
        .replace("\\\\set x 1", &format!("\\\\set x {deep}"));
    assert!(json.contains("((((("), "{json}");
    let mut a = assign("c-deep", "pgbench", serde_json::Value::Null);
    a.params_json = json;
    a
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_refuses_what_a_hostile_controller_sends() {
    let scratch = std::env::temp_dir().join(format!("pgfleet-hostile-{}", std::process::id()));
    let root = scratch.join("a").join("root");
    std::fs::create_dir_all(root.join("clusters")).unwrap();
    // What `clusters/../../x` names: it must survive.
    let outside = scratch.join("a").join("x");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("keep"), "mine").unwrap();

    let mut with_setting = assign("c-setting", "pgbench-init", init(1, 0));
    with_setting
        .settings
        .insert("archive_command".into(), "touch /tmp/pwned".into());
    let cases: Vec<(Assign, &str)> = vec![
        (assign("../../x", "pgbench-init", init(1, 0)), "cell id"),
        (assign("/etc", "pgbench-init", init(1, 0)), "cell id"),
        (
            assign(
                "c-huge",
                "toast-slice",
                serde_json::json!({"storage_modes": ["external"], "dataset": "mixed",
                    "value_bytes": 1u64 << 31, "offsets": [{"label": "0%", "byte": 1}],
                    "slice_bytes": 100, "duration_s": 1.0, "repeats": 1, "warmup_s": 0.0,
                    "cache": "warm"}),
            ),
            "value_bytes = 2147483648 is out of range",
        ),
        (
            assign("c-scale", "pgbench-init", init(1_000_000_000, 0)),
            "scale = 1000000000 is out of range",
        ),
        (
            assign("c-negative", "pgbench-init", init(1, -1)),
            "integer `-1`",
        ),
        (with_setting, "`archive_command` takes free text"),
        // A script the controller's validation would have refused: its
        // expression 3,000 parentheses deep (the agent's parse is bounded).
        (deep_script(), "too deeply nested"),
    ];
    let (results_tx, mut results) = mpsc::channel(16);
    let svc = Hostile {
        assigns: cases.iter().map(|(a, _)| a.clone()).collect(),
        results: results_tx,
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(AgentSessionServer::new(svc))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );

    let agent = PathBuf::from(env!("CARGO_BIN_EXE_pgfleet-agent"));
    let mut child = tokio::process::Command::new(agent)
        .arg("run")
        .args(["--controller", &format!("http://{addr}")])
        .args(["--agent-id", "a-1", "--give-up-after-s", "10"])
        .arg("--data-root")
        .arg(&root)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut got = Vec::new();
    for _ in 0..cases.len() {
        let r = tokio::time::timeout(Duration::from_secs(30), results.recv())
            .await
            .expect("the agent answers every assignment")
            .unwrap();
        got.push(r);
    }
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("the agent exits when told to")
        .unwrap();
    assert!(status.success(), "{status}");
    for ((a, want), r) in cases.iter().zip(&got) {
        assert_eq!(r.cell_id, a.cell_id);
        assert_eq!(
            r.status,
            CellStatus::Failed as i32,
            "{}: {}",
            a.cell_id,
            r.error
        );
        assert!(r.error.contains(want), "{}: {}", a.cell_id, r.error);
    }
    // Nothing outside the data root was touched; nothing inside was left.
    assert_eq!(
        std::fs::read_to_string(outside.join("keep")).unwrap(),
        "mine"
    );
    let left: Vec<_> = std::fs::read_dir(root.join("clusters"))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "{left:?}");
    assert!(!std::path::Path::new("/tmp/pwned").exists());
    std::fs::remove_dir_all(&scratch).unwrap();
}
