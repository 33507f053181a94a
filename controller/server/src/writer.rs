//! A run's store writer: stores the samples agents stream and the cells'
//! ends, a batch per transaction, off the scheduler's task, and sends each
//! acknowledgement only once everything queued before it is committed.
//!
//! The scheduler queues, in the order agents' messages arrive, samples
//! (`Write::Sample`), cells' ends (`Write::End`, each confirmed back on the
//! `stored` channel) and the acknowledgements they earn (`Write::Ack`: a
//! `SampleAck`, or a `ResultAck`, which makes the agent forget the cell's
//! unacknowledged samples). The writer takes what is queued, commits it in
//! one transaction (one fsync for a burst of 200 results), then sends the
//! acknowledgements of that batch: an agent never forgets a sample or a
//! result the store does not hold, so a controller killed between hand-off
//! and commit loses nothing (the agent replays it to the next controller).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use tokio::sync::mpsc;

use pgfleet_proto::v1::ControllerMessage;
use pgfleet_proto::v1::controller_message::Msg as CMsg;

use crate::events::ToAgent;
use pgfleet_store::{Entry, Store};

/// What the writer does, in queue order.
pub enum Write {
    /// A write (a cell's end: whether it was stored goes back on `stored`).
    Store(Entry),
    /// Sent to `agent_id` once every sample queued before it is committed.
    Ack {
        agent_id: String,
        tx: ToAgent,
        msg: ControllerMessage,
    },
}

/// How many times a batch is tried before its acknowledgements are given
/// up (the agents keep those samples until their cell's result is
/// acknowledged), and the first pause between tries (doubling).
const TRIES: u32 = 8;
const FIRST_PAUSE: Duration = Duration::from_millis(100);

/// Fault injection for tests (`PGFLEET_FAULT_SAMPLE_COMMIT_DELAY_MS`): a
/// pause before each commit, which widens the window between a sample's
/// hand-off and its commit that the fault test kills the controller in.
fn commit_delay() -> Option<Duration> {
    std::env::var("PGFLEET_FAULT_SAMPLE_COMMIT_DELAY_MS")
        .ok()?
        .parse()
        .ok()
        .map(Duration::from_millis)
}

/// Starts the writer of `run_id`'s samples; it ends when every sender is
/// dropped, after storing what was queued.
pub fn spawn(
    run_id: String,
    store: Store,
    mut rx: mpsc::UnboundedReceiver<Write>,
    stored: mpsc::UnboundedSender<(String, bool)>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let delay = commit_delay();
        let mut queued = Vec::new();
        // (agent, cell) pairs with samples that could not be stored: no
        // later (cumulative) SampleAck may cover them; ("", cell) for a
        // cell whose end could not be: no ResultAck.
        let mut withheld: HashSet<(String, String)> = HashSet::new();
        while rx.recv_many(&mut queued, 512).await > 0 {
            let (mut entries, mut acks) = (Vec::new(), Vec::new());
            for w in queued.drain(..) {
                match w {
                    Write::Store(e) => entries.push(e),
                    Write::Ack { agent_id, tx, msg } => acks.push((agent_id, tx, msg)),
                }
            }
            if let Some(d) = delay {
                tokio::time::sleep(d).await;
            }
            let ok = entries.is_empty() || commit(&run_id, &store, &entries).await;
            for e in entries {
                match e {
                    Entry::Sample(s) if !ok => {
                        withheld.insert((s.agent_id, s.cell_id));
                    }
                    Entry::End(e) => {
                        let key = (String::new(), e.cell_id.clone());
                        if ok {
                            // Stored now, even if an earlier try failed.
                            withheld.remove(&key);
                        } else {
                            withheld.insert(key);
                        }
                        let _ = stored.send((e.cell_id, ok));
                    }
                    _ => {}
                }
            }
            send_acks(acks, &withheld);
        }
    })
}

/// Commits one batch, retrying with backoff; false when it never could.
async fn commit(run_id: &str, store: &Store, entries: &[Entry]) -> bool {
    let mut pause = FIRST_PAUSE;
    for attempt in 1..=TRIES {
        let (st, run, batch) = (store.clone(), run_id.to_string(), entries.to_vec());
        let r = tokio::task::spawn_blocking(move || st.commit_owned(run, batch)).await;
        match r.map_err(|e| pgfleet_store::Error::Store(e.to_string())) {
            Ok(Ok(())) => return true,
            Ok(Err(e)) | Err(e) if attempt < TRIES => {
                tracing::warn!(run = %run_id, attempt, "storing {} entries failed, retrying in {pause:?}: {e}", entries.len());
            }
            Ok(Err(e)) | Err(e) => {
                tracing::error!(
                    run = %run_id,
                    "storing {} entries failed {TRIES} times, giving them up (not acknowledged: agents keep results to replay; the report lacks the samples): {e}",
                    entries.len()
                );
                return false;
            }
        }
        tokio::time::sleep(pause).await;
        pause *= 2;
    }
    false
}

/// Sends a batch's acknowledgements: per agent and cell only the highest
/// `SampleAck` (they are cumulative), none for a withheld pair, and every
/// `ResultAck` in its place after them.
fn send_acks(
    acks: Vec<(String, ToAgent, ControllerMessage)>,
    withheld: &HashSet<(String, String)>,
) {
    let mut highest: HashMap<(String, String), u64> = HashMap::new();
    for (agent, _, m) in &acks {
        if let Some(CMsg::SampleAck(a)) = &m.msg {
            let e = highest
                .entry((agent.clone(), a.cell_id.clone()))
                .or_default();
            *e = (*e).max(a.seq);
        }
    }
    for (agent, tx, m) in acks {
        match &m.msg {
            Some(CMsg::SampleAck(a)) => {
                let key = (agent, a.cell_id.clone());
                if withheld.contains(&key) || highest.get(&key) != Some(&a.seq) {
                    continue;
                }
                highest.remove(&key);
            }
            Some(CMsg::ResultAck(a)) if withheld.contains(&(String::new(), a.cell_id.clone())) => {
                continue;
            }
            _ => {}
        }
        // A full or closed channel: the acknowledgement is lost, the agent
        // replays those samples, which are kept once (their numbers).
        tx.send(m);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pgfleet_proto::v1::{ResultAck, SampleAck};

    fn sample(agent: &str, cell: &str, seq: u64) -> pgfleet_store::NewSample {
        pgfleet_store::NewSample {
            cell_id: cell.into(),
            kind: "live".into(),
            data: serde_json::json!({"second": seq}),
            agent_id: agent.into(),
            seq,
        }
    }

    fn ack(agent: &str, tx: &ToAgent, msg: CMsg) -> Write {
        Write::Ack {
            agent_id: agent.into(),
            tx: tx.clone(),
            msg: ControllerMessage { msg: Some(msg) },
        }
    }

    fn sample_ack(cell: &str, seq: u64) -> CMsg {
        CMsg::SampleAck(SampleAck {
            cell_id: cell.into(),
            seq,
        })
    }

    fn store(name: &str) -> (Store, std::path::PathBuf) {
        let dir =
            std::env::temp_dir().join(format!("pgfleet-writer-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("s.db");
        let store = Store::open(&path).unwrap();
        store
            .create_run(&pgfleet_store::NewRun::bare("r", pgfleet_store::Owner::Run))
            .unwrap();
        (store, path)
    }

    #[tokio::test]
    async fn acknowledgements_follow_the_commit_and_are_cumulative() {
        let (store, path) = store("acks");
        let (wtx, wrx) = mpsc::unbounded_channel();
        let (atx, mut arx) = ToAgent::channel();
        for seq in 1..=3 {
            wtx.send(Write::Store(Entry::Sample(sample("a", "c", seq))))
                .unwrap();
            wtx.send(ack("a", &atx, sample_ack("c", seq))).unwrap();
        }
        wtx.send(ack(
            "a",
            &atx,
            CMsg::ResultAck(ResultAck {
                cell_id: "c".into(),
            }),
        ))
        .unwrap();
        drop(wtx);
        let (stx, _srx) = mpsc::unbounded_channel();
        spawn("r".into(), store.clone(), wrx, stx).await.unwrap();
        // Everything acknowledged is stored.
        assert_eq!(store.samples("r", "live").unwrap().len(), 3);
        drop(atx);
        let got: Vec<CMsg> = futures::StreamExt::collect::<Vec<_>>(&mut arx)
            .await
            .into_iter()
            .map(|m| m.unwrap().msg.unwrap())
            .collect();
        // One cumulative SampleAck for the batch, then the ResultAck.
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(matches!(&got[0], CMsg::SampleAck(a) if a.seq == 3));
        assert!(matches!(&got[1], CMsg::ResultAck(_)));
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    #[tokio::test]
    async fn samples_and_results_that_cannot_be_stored_are_never_acknowledged() {
        let (store, path) = store("unstored");
        // Every insert fails: the table is gone.
        rusqlite::Connection::open(&path)
            .unwrap()
            .execute_batch("DROP TABLE samples")
            .unwrap();
        let (wtx, wrx) = mpsc::unbounded_channel();
        let (atx, mut arx) = ToAgent::channel();
        wtx.send(Write::Store(Entry::Sample(sample("a", "c", 1))))
            .unwrap();
        wtx.send(ack("a", &atx, sample_ack("c", 1))).unwrap();
        wtx.send(Write::Store(Entry::End(pgfleet_store::CellEnd {
            cell_id: "c".into(),
            state: pgfleet_store::CellState::Succeeded,
            error: None,
            environment: None,
            points: vec![],
        })))
        .unwrap();
        wtx.send(ack(
            "a",
            &atx,
            CMsg::ResultAck(ResultAck {
                cell_id: "c".into(),
            }),
        ))
        .unwrap();
        drop(wtx);
        tokio::time::pause();
        let (stx, mut srx) = mpsc::unbounded_channel();
        spawn("r".into(), store, wrx, stx).await.unwrap();
        // The scheduler hears that the cell's end was not stored.
        assert_eq!(srx.try_recv().unwrap(), ("c".to_string(), false));
        drop(atx);
        let got = futures::StreamExt::collect::<Vec<_>>(&mut arx).await;
        assert!(
            got.is_empty(),
            "an unstored sample was acknowledged: {got:?}"
        );
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }
}
