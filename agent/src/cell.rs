//! Running one assigned cell: provision a cluster, run the workload, collect
//! the environment, tear the cluster down — on every path.

use std::collections::BTreeMap;
use std::path::PathBuf;

use pgfleet_proto::environment::{self, Environment};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::cluster::throttle::Caps;
use crate::cluster::{Cluster, ClusterSpec, RunAs};
use crate::pgbin::PgBin;
use crate::workload::{self, CellContext, Output, phase};
use crate::{Error, Result, host};
use pgfleet_proto::v1::{
    AgentMessage, Assign, CellProgress, CellResult, CellStatus, Endpoint, Point, RoleReady,
    agent_message::Msg,
};
use pgfleet_proto::workload::{Params, approx_bytes};
use tokio::sync::watch;

/// What the agent was started with, needed to provision clusters.
#[derive(Debug, Clone)]
pub struct AgentEnv {
    pub pg: std::result::Result<PgBin, String>,
    pub run_as: std::result::Result<Option<RunAs>, String>,
    pub data_root: PathBuf,
    /// Where datasets are published and restored from.
    pub datasets: pgfleet_proto::dataset::LocalStore,
    /// Restore by reflink where the filesystem can (`--dataset-reflink`):
    /// instant, but the cluster's first write to each block copies it
    /// (BENCHMARKS.md: 14-24 % fewer TPS than a built cell on XFS), so
    /// restores copy unless asked.
    pub dataset_reflink: bool,
    /// The object store behind it (`--dataset-remote`): datasets missing
    /// locally are downloaded from it, built ones uploaded to it.
    pub remote: Option<std::sync::Arc<crate::remote::Remote>>,
    /// The CSI snapshot the data root's volume was created from
    /// (`--volume-snapshot`): the datasets it brought are hydrated before
    /// a cell restores one.
    pub snapshot: Option<std::sync::Arc<crate::hydrate::Snapshot>>,
    pub storage_profile: String,
    /// The profile's caps (uncapped for `nvme`).
    pub caps: Caps,
    /// Whether the caps are applied (block-I/O throttling). A capped
    /// profile with `emulate: false` runs uncapped and says so.
    pub emulated: bool,
    /// Where peers on other hosts reach this agent's clusters; None: this
    /// host only (loopback).
    pub address: Option<std::net::IpAddr>,
    /// The instance this agent stands for.
    pub instance: Instance,
    /// The fio program kind fio runs (`--fio`).
    pub fio: PathBuf,
    /// What the emulated storage delivered to a short fio probe in the
    /// first cell's cgroups (`storage.delivered` in every cell's
    /// environment); probed once per agent.
    pub delivered: tokio::sync::OnceCell<environment::Delivered>,
    /// The cluster a `reuse_cluster` cell left for the next one.
    pub kept: std::sync::Arc<crate::keep::Slot>,
}

/// The instance class's machine: a label, and the memory and CPUs its
/// clusters are limited to when emulated (0 = the host's).
#[derive(Debug, Clone, Default)]
pub struct Instance {
    pub instance_type: String,
    pub memory_bytes: u64,
    pub cpus: u32,
    pub emulated: bool,
}

/// How the session steers a running cell: cancel it, release a serving
/// role, and hand it its peers' endpoints as they arrive.
#[derive(Debug, Clone)]
pub struct Control {
    pub cancel: CancellationToken,
    pub release: CancellationToken,
    pub peers: watch::Receiver<BTreeMap<String, Endpoint>>,
}

impl Instance {
    /// The memory and CPUs its clusters are held to: the emulated ones,
    /// or (0, 0) when not emulated (the host's).
    pub fn limits(&self) -> (u64, u32) {
        if self.emulated {
            (self.memory_bytes, self.cpus)
        } else {
            (0, 0)
        }
    }
}

impl AgentEnv {
    pub fn clusters_dir(&self) -> PathBuf {
        self.data_root.join("clusters")
    }
}

/// Runs the cell to its end and returns its result. Never panics on workload
/// errors: they become a FAILED result with the error text.
/// `params` are the assignment's, as `assign::check` parsed and checked them.
pub async fn run(
    env: &AgentEnv,
    assign: Assign,
    params: Params,
    events: mpsc::Sender<AgentMessage>,
    control: Control,
) -> CellResult {
    let cell_id = assign.cell_id.clone();
    let mut environment: Option<Environment> = None;
    // The agent's side of the cell: a child of the controller's cell span
    // (its traceparent came with the assignment); the phases are its
    // children.
    let span = tracing::info_span!(
        target: "pgfleet",
        "agent cell",
        cell_id = %assign.cell_id,
        workload = %assign.workload,
        role = %assign.role,
        run_id = %assign.run_id,
        postgres_version = tracing::field::Empty,
    );
    pgfleet_proto::telemetry::set_parent(&span, &assign.traceparent);
    let outcome = run_inner(env, &assign, &params, &events, &control, &mut environment)
        .instrument(span.clone())
        .await;
    if let Some(e) = environment
        .as_ref()
        .filter(|e| !e.postgres.version.is_empty())
    {
        span.record("postgres_version", e.postgres.version.as_str());
    }
    let (status, error, points) = match outcome {
        Ok(out) => (CellStatus::Succeeded, String::new(), out.points),
        Err(Error::Cancelled(why)) => (CellStatus::Cancelled, why, Vec::new()),
        Err(e) => (CellStatus::Failed, e.to_string(), Vec::new()),
    };
    CellResult {
        cell_id,
        status: status as i32,
        error,
        points: points
            .into_iter()
            .map(|p| Point {
                params_json: p.params_json,
                metrics_json: p.metrics_json,
            })
            .collect(),
        environment_json: environment
            .map(|e| serde_json::to_string(&e).unwrap_or_default())
            .unwrap_or_default(),
        role: assign.role,
    }
}

async fn run_inner(
    env: &AgentEnv,
    assign: &Assign,
    params: &Params,
    events: &mpsc::Sender<AgentMessage>,
    control: &Control,
    environment: &mut Option<Environment>,
) -> Result<Output> {
    let cancel = &control.cancel;
    let pg = env.pg.clone().map_err(Error::PgBin)?;
    let run_as = env.run_as.clone().map_err(Error::Provision)?;
    let spec = cluster_spec(env, assign, params, pg, run_as);
    let Some(DataNeeded {
        declared,
        wanted,
        build_only,
    }) = data_wanted(env, assign, params, &spec, control, environment).await?
    else {
        return Ok(Output::default());
    };
    check_room(env, &spec, wanted.as_ref(), params)?;
    let mut prov = declared.as_ref().map(|d| crate::dataset::Provenance {
        label: d.label.clone(),
        how: "loaded".into(),
        cache: "as loaded".into(),
        ..Default::default()
    });
    // `reuse_cluster`: the cluster the previous cell of this run, dataset
    // and cluster spec left on this agent, reset; else provisioned.
    let reuse_key = wanted
        .as_ref()
        .filter(|_| assign.reuse_cluster && !build_only && assign.peers.is_empty())
        .map(|w| crate::keep::key(&assign.run_id, &w.fingerprint, &spec));
    let (cluster, source, cells_on_cluster) = cluster_for(
        env,
        assign,
        &spec,
        params,
        wanted.as_ref(),
        reuse_key.as_deref(),
        prov.as_mut(),
        events,
        cancel,
    )
    .await?;
    // What a kept cluster needs from the cell: its catalog before the
    // workload ran, and the load's figures.
    let mut before: Option<String> = None;
    let mut loaded_figures: Option<workload::Loaded> = None;
    // From here the cluster is torn down on every path: explicitly below, or
    // by its Drop if this future is dropped.
    let outcome = async {
        let environment = environment.insert(
            collect_environment(env, &cluster, &spec)
                .instrument(phase("collect"))
                .await?,
        );
        if env.emulated && env.caps.is_capped() {
            let delivered = env
                .delivered
                .get_or_try_init(|| {
                    workload::probe_storage(&cluster, &env.fio, env.caps, cancel)
                        .instrument(phase("storage probe"))
                })
                .await?;
            environment.storage.delivered = Some(delivered.clone());
        }
        let mut ctx = CellContext {
            cell_id: assign.cell_id.clone(),
            cluster: &cluster,
            events: events.clone(),
            cancel: cancel.clone(),
            role: assign.role.clone(),
            release: control.release.clone(),
            peers: control.peers.clone(),
            loaded: None,
            fio: env.fio.clone(),
        };
        let measured = async {
            if declared.is_some() {
                ctx.loaded = Some(
                    load_dataset(
                        env,
                        &ctx,
                        params,
                        source,
                        wanted.as_ref(),
                        prov.as_mut(),
                        !build_only,
                    )
                    .instrument(phase("dataset"))
                    .await?,
                );
                environment.dataset = serde_json::to_value(&prov).ok();
                if reuse_key.is_some() {
                    before = Some(crate::keep::inventory(&cluster).await?);
                    loaded_figures = ctx.loaded.clone();
                }
                // Cells held for this dataset may start (a lost message
                // only holds them until this cell ends).
                if let Some(w) = &wanted {
                    let ready = pgfleet_proto::dataset::READY_PHASE;
                    let message = format!("dataset {} ready", w.fingerprint);
                    let _ = events
                        .send(progress(&assign.cell_id, ready, &message))
                        .await;
                }
            }
            // A role of a multi-role cell tells its peers where its cluster
            // is once it holds its data.
            if !assign.peers.is_empty() {
                announce_ready(env, assign, &cluster, ctx.loaded.as_ref(), events).await?;
            }
            if build_only {
                return Ok(Output::default());
            }
            workload::run(&mut ctx, params)
                .instrument(phase("workload"))
                .await
        };
        tokio::select! {
            r = measured => r,
            _ = cancel.cancelled() => Err(Error::Cancelled("cancelled while running".into())),
            _ = cluster.exited() => Err(Error::ServerExited),
        }
    }
    .await;
    let outcome = match outcome {
        Err(e) => Err(cluster.explain_failure(e).await),
        ok => ok,
    };
    let keeping = match (reuse_key, before, loaded_figures) {
        (Some(key), Some(before), Some(loaded)) => Some(Keeping {
            key,
            before,
            loaded,
            cells: cells_on_cluster,
        }),
        _ => None,
    };
    finish(env, assign, cluster, outcome, keeping, cancel, events).await
}

/// Room in the data root for the cell's cluster, unless its dataset waits
/// on a volume of its own (its cluster goes there).
fn check_room(
    env: &AgentEnv,
    spec: &ClusterSpec,
    wanted: Option<&crate::dataset::Wanted>,
    params: &Params,
) -> Result<()> {
    let on_cell_volume = wanted.is_some_and(|w| {
        env.snapshot
            .as_deref()
            .is_some_and(|s| !Cluster::own_volume(spec) && s.has_volume(&w.fingerprint))
    });
    if on_cell_volume {
        return Ok(());
    }
    check_disk(&env.clusters_dir(), params)
}

/// What data a cell's role needs: its dataset, and where it is published.
struct DataNeeded {
    declared: Option<pgfleet_proto::dataset::Dataset>,
    wanted: Option<crate::dataset::Wanted>,
    build_only: bool,
}

/// The data a cell's role needs, or None when the role has nothing to do:
/// `pgfleet datasets build` of a dataset another role builds, or that is
/// published already.
async fn data_wanted(
    env: &AgentEnv,
    assign: &Assign,
    params: &Params,
    spec: &ClusterSpec,
    control: &Control,
    environment: &mut Option<Environment>,
) -> Result<Option<DataNeeded>> {
    let cancel = &control.cancel;
    // The cell's data: restored from the dataset store when published
    // there, else loaded here (and published, with `data: reuse`).
    let mode = pgfleet_proto::dataset::Mode::parse(&assign.dataset).ok_or_else(|| {
        Error::Provision(format!(
            "dataset `{}` is not one of {}",
            assign.dataset,
            pgfleet_proto::dataset::Mode::NAMES.join(", ")
        ))
    })?;
    // A multi-role cell's dataset is on one role's cluster.
    let declared = params.dataset_of(&assign.role);
    let build_only = mode == pgfleet_proto::dataset::Mode::Build;
    if build_only && declared.is_none() && params.dataset().is_some() {
        // `pgfleet datasets build`: another role of the cell builds it and
        // reports its cluster once it has (this role may be the lead, whose
        // end releases the others).
        let role = params.dataset_role();
        let mut peers = control.peers.clone();
        tokio::select! {
            r = peers.wait_for(|m| m.contains_key(role)) => r.map_err(|_| {
                Error::Session("the session ended while the dataset was built".into())
            })?,
            _ = cancel.cancelled() => return Err(Error::Cancelled("cancelled while the dataset was built".into())),
        };
        return Ok(None);
    }
    let wanted = declared
        .clone()
        .filter(|_| mode != pgfleet_proto::dataset::Mode::Fresh)
        .map(|d| crate::dataset::Wanted::of(&spec.pg, d));
    if build_only {
        // `pgfleet datasets build`: nothing to do when it is published.
        let Some(w) = &wanted else {
            return Err(Error::Workload {
                workload: params.kind().name().into(),
                message: "this kind has no dataset to build".into(),
            });
        };
        if let Ok(Some(m)) = env.datasets.find(&w.fingerprint) {
            environment.get_or_insert_default().dataset = Some(serde_json::json!({
                "fingerprint": w.fingerprint, "label": w.dataset.label, "how": "already published",
                "store": env.datasets.dir, "bytes": m.bytes,
                "built_by": format!("{} on {}", m.built_by, m.host), "built_at": m.created_at,
            }));
            return Ok(None);
        }
    }
    Ok(Some(DataNeeded {
        declared,
        wanted,
        build_only,
    }))
}

/// The cell's cluster: the one the previous cell of its dataset left on
/// this agent, reset (`reuse_cluster`), or a new one; with its data's
/// source and how many cells it has served counting this one.
#[allow(clippy::too_many_arguments)]
async fn cluster_for(
    env: &AgentEnv,
    assign: &Assign,
    spec: &ClusterSpec,
    params: &Params,
    wanted: Option<&crate::dataset::Wanted>,
    reuse_key: Option<&str>,
    mut prov: Option<&mut crate::dataset::Provenance>,
    events: &mpsc::Sender<AgentMessage>,
    cancel: &CancellationToken,
) -> Result<(Cluster, Source, u32)> {
    let reused = take_kept(env, assign, reuse_key, params, prov.as_deref_mut(), events).await;
    Ok(match reused {
        Some((k, seconds)) => {
            let crate::keep::Kept {
                cluster,
                loaded,
                first_cell,
                cells,
                ..
            } = *k;
            if let (Some(p), Some(w)) = (prov.as_deref_mut(), wanted) {
                p.fingerprint = w.fingerprint.clone();
                p.how = "reused".into();
                p.cache = "as the previous cell left it".into();
                p.reused_from = first_cell;
                p.reused_by_cells = u64::from(cells) + 1;
                p.reset_seconds = seconds;
            }
            (cluster, Source::Reused(Box::new(loaded)), cells + 1)
        }
        None => {
            let (cluster, source) = tokio::select! {
                r = provision_with_dataset(env, assign, spec, wanted, prov, events, cancel)
                    .instrument(phase("provision")) => r?,
                _ = cancel.cancelled() => return Err(Error::Cancelled("cancelled while provisioning".into())),
            };
            (cluster, source, 1)
        }
    })
}

/// What a `reuse_cluster` cell hands the next cell of its dataset: the
/// key it is kept under, the catalog before the workload, the load's
/// figures and how many cells the cluster has served.
struct Keeping {
    key: String,
    before: String,
    loaded: workload::Loaded,
    cells: u32,
}

/// The cell's end: its cluster kept for the next cell of its dataset
/// (a succeeded `reuse_cluster` cell that created no catalog object), or
/// torn down.
async fn finish(
    env: &AgentEnv,
    assign: &Assign,
    cluster: Cluster,
    outcome: Result<Output>,
    keeping: Option<Keeping>,
    cancel: &CancellationToken,
    events: &mpsc::Sender<AgentMessage>,
) -> Result<Output> {
    // A succeeded `reuse_cluster` cell that created no catalog object
    // leaves its cluster to the next cell of its dataset.
    if let (
        Ok(_),
        Some(Keeping {
            key,
            before,
            loaded,
            cells,
        }),
    ) = (&outcome, keeping)
        && !cancel.is_cancelled()
        && cluster.server_alive()
    {
        match crate::keep::inventory(&cluster).await {
            Ok(after) if after == before => {
                let _ = events.try_send(progress(
                    &assign.cell_id,
                    "teardown",
                    "keeping the cluster for the next cell of its dataset",
                ));
                env.kept
                    .keep(crate::keep::Kept {
                        first_cell: cluster_name(&cluster, &assign.cell_id),
                        cluster,
                        key,
                        loaded,
                        cells,
                        inventory: after,
                    })
                    .await;
                return outcome;
            }
            not_kept => {
                let why = match not_kept {
                    Ok(after) => crate::keep::difference(&before, &after),
                    Err(e) => e.to_string(),
                };
                tracing::warn!(cell = %assign.cell_id, "cluster not kept: {why}");
                env.kept
                    .refuse(format!(
                        "the cluster of cell {} was not kept: {why}",
                        assign.cell_id
                    ))
                    .await;
            }
        }
    }
    let _ = events.try_send(progress(
        &assign.cell_id,
        "teardown",
        "stopping the cluster",
    ));
    let teardown = cluster.teardown().instrument(phase("teardown")).await;
    let out = outcome?;
    teardown?;
    Ok(out)
}

/// The cell's cluster: the agent's PostgreSQL, the class's caps and
/// instance, the scenario's settings, and in a multi-role cell its peers.
fn cluster_spec(
    env: &AgentEnv,
    assign: &Assign,
    params: &Params,
    pg: PgBin,
    run_as: Option<RunAs>,
) -> ClusterSpec {
    ClusterSpec {
        pg,
        clusters_dir: env.clusters_dir(),
        name: assign.cell_id.clone(),
        run_as,
        settings: assign
            .settings
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect::<BTreeMap<_, _>>(),
        caps: if env.emulated {
            env.caps
        } else {
            Caps::default()
        },
        // Accounting needs a cgroup, so root; without, the kind's device
        // figures are None and its report says so.
        account_io: params.account_io() && nix::unistd::geteuid().is_root(),
        allow_shell: params.allow_shell(),
        memory_bytes: env.instance.limits().0,
        cpus: env.instance.limits().1,
        // A multi-role cell's cluster is reached by its peers: it listens on
        // the agent's address too and admits exactly the peers' addresses.
        listen: env
            .address
            .filter(|_| !assign.peers.is_empty())
            .into_iter()
            .collect(),
        peers: assign
            .peers
            .iter()
            .filter_map(|p| p.address.parse().ok())
            .collect(),
    }
}

/// The cluster a previous cell of this run and dataset left (`reuse_cluster`),
/// reset for this one, with the reset's seconds; None (and why, in the
/// provenance) when there is none or its reset failed.
async fn take_kept(
    env: &AgentEnv,
    assign: &Assign,
    reuse_key: Option<&str>,
    params: &Params,
    mut prov: Option<&mut crate::dataset::Provenance>,
    events: &mpsc::Sender<AgentMessage>,
) -> Option<(Box<crate::keep::Kept>, f64)> {
    match env.kept.take(reuse_key).await {
        crate::keep::Found::Reuse(k) => {
            let _ = events.try_send(progress(
                &assign.cell_id,
                "provision",
                &format!("resetting the cluster of cell {}", k.first_cell),
            ));
            match crate::keep::reset(&k, params.reset().unwrap_or_default()).await {
                Ok(seconds) => Some((k, seconds)),
                Err(e) => {
                    if let Some(p) = prov.as_mut() {
                        p.not_reused = Some(format!(
                            "the cluster of cell {} was not reused: {e}",
                            k.first_cell
                        ));
                    }
                    let _ = k.cluster.teardown().await;
                    None
                }
            }
        }
        crate::keep::Found::None(why) => {
            if let Some(p) = prov.as_mut() {
                p.not_reused = why;
            }
            None
        }
    }
}

/// Tells a multi-role cell's peers where this role's cluster is, once it
/// holds its data (the dataset's role adds the load figures, which the lead
/// reports).
async fn announce_ready(
    env: &AgentEnv,
    assign: &Assign,
    cluster: &Cluster,
    loaded: Option<&workload::Loaded>,
    events: &mpsc::Sender<AgentMessage>,
) -> Result<()> {
    let host = env
        .address
        .map(|a| a.to_string())
        .unwrap_or_else(|| "127.0.0.1".into());
    let mut endpoint = cluster.endpoint(&host);
    if let Some(loaded) = loaded {
        endpoint.loaded_json = workload::to_json(loaded);
    }
    events
        .send(AgentMessage {
            msg: Some(Msg::RoleReady(RoleReady {
                cell_id: assign.cell_id.clone(),
                role: assign.role.clone(),
                endpoint: Some(endpoint),
            })),
        })
        .await
        .map_err(|_| Error::Session("event channel closed".into()))
}

/// Where a cell's data comes from, once its cluster is up.
enum Source {
    /// No dataset (the kind has none), or `data: fresh`: load it.
    Load,
    /// Load it, then publish it (the build lock is held).
    Build(pgfleet_proto::dataset::Lock),
    /// Restored from the store: the manifest's load figures.
    Restored(serde_json::Value),
    /// The previous cell's cluster, reset (`reuse_cluster`): its figures.
    Reused(Box<workload::Loaded>),
}

/// The cell a cluster was first provisioned for (its directory's name).
fn cluster_name(cluster: &Cluster, fallback: &str) -> String {
    cluster
        .dir()
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_else(|| fallback.to_string())
}

/// Provisions the cell's cluster: restored from the dataset store when its
/// dataset is published there (waiting while another cell builds it), else
/// by initdb. A published dataset whose files do not match its manifest is
/// discarded and this cell builds it again (said in `prov.discarded`).
async fn provision_with_dataset(
    env: &AgentEnv,
    assign: &Assign,
    spec: &ClusterSpec,
    wanted: Option<&crate::dataset::Wanted>,
    prov: Option<&mut crate::dataset::Provenance>,
    events: &mpsc::Sender<AgentMessage>,
    cancel: &CancellationToken,
) -> Result<(Cluster, Source)> {
    use crate::dataset::{self, Ticket};
    let cell = &assign.cell_id;
    let (Some(w), Some(prov)) = (wanted, prov) else {
        let _ = events.try_send(progress(cell, "provision", "initdb and start"));
        return Ok((Cluster::provision(spec).await?, Source::Load));
    };
    let fp = &w.fingerprint;
    prov.fingerprint = fp.clone();
    prov.plan_key = w.dataset.plan_key();
    prov.store = env.datasets.dir.display().to_string();
    prov.remote = env
        .remote
        .as_ref()
        .map(|r| r.url.clone())
        .unwrap_or_default();
    prov.cache = "evicted".into();
    // The remote store is asked once per cell: a dataset it gave that then
    // fails its restore is built here, not fetched again.
    let mut remote_tried = false;
    loop {
        let waited = std::time::Instant::now();
        let ticket = dataset::acquire(&env.datasets, fp, cancel, |s| {
            let _ = events.try_send(progress(
                cell,
                "dataset",
                &format!("waiting {s:.0} s for dataset {fp}, which another cell is building"),
            ));
        })
        .await?;
        prov.wait_seconds += waited.elapsed().as_secs_f64();
        match ticket {
            Ticket::Build(lock) => {
                if let Some(remote) = env.remote.as_deref().filter(|_| !remote_tried) {
                    remote_tried = true;
                    if fetch(remote, env, fp, prov, events, cell, cancel).await? {
                        // Published locally now: restore it (the next ticket).
                        drop(lock);
                        continue;
                    }
                }
                let _ = events.try_send(progress(cell, "provision", "initdb and start"));
                prov.how = "built".into();
                return Ok((Cluster::provision(spec).await?, Source::Build(lock)));
            }
            Ticket::Restore(m, lock) => {
                // A volume of the snapshot for this cell alone: no copy.
                // (Not where the cluster gets a device of its own: that is
                // another filesystem.)
                if let Some(snap) = env.snapshot.as_deref()
                    && !Cluster::own_volume(spec)
                    && let Some(v) = snap.take_volume(fp)
                {
                    drop(lock);
                    match in_place(snap, v, spec, prov, events, cell, cancel).await {
                        Err(Error::DatasetCorrupt { detail, .. }) => {
                            tracing::warn!(dataset = %fp, %detail, "a cell volume's dataset does not match its manifest; restoring by copy instead");
                            continue;
                        }
                        r => return r,
                    }
                }
                if let Some(snap) = env.snapshot.as_deref() {
                    prov.hydration = snap
                        .before_restore(
                            &env.datasets,
                            &m,
                            cell,
                            |done, total| {
                                let message = format!(
                                    "hydrating dataset {fp} from volume snapshot {}",
                                    snap.name
                                );
                                let _ = events
                                    .try_send(transfer(cell, "hydrate", done, total, message));
                            },
                            cancel,
                        )
                        .await?;
                }
                let _ = events.try_send(progress(
                    cell,
                    "dataset",
                    &format!("restoring dataset {fp} ({})", approx_bytes(m.bytes)),
                ));
                let mut copied = None;
                let restored = Cluster::provision_restored(spec, &m.superuser_password, |data| {
                    let (m, copied) = (&m, &mut copied);
                    async move {
                        let c = dataset::restore(
                            &env.datasets,
                            m,
                            &data,
                            spec.run_as.as_ref(),
                            env.dataset_reflink,
                            |done, total| {
                                let message = format!("restoring dataset {}", m.fingerprint);
                                let _ = events
                                    .try_send(transfer(cell, "restore", done, total, message));
                            },
                            cancel,
                        )
                        .await?;
                        *copied = Some(c);
                        Ok(())
                    }
                })
                .await;
                drop(lock);
                match restored {
                    Ok(cluster) => {
                        let c = copied.unwrap_or(crate::dataset::Copied {
                            bytes: 0,
                            seconds: 0.0,
                            reflink: false,
                        });
                        prov.how = "restored".into();
                        prov.bytes = m.bytes;
                        prov.restore_seconds = c.seconds;
                        prov.restore_mb_per_s = m.bytes as f64 / 1e6 / c.seconds.max(1e-9);
                        prov.method = (if c.reflink { "reflink" } else { "copy" }).into();
                        prov.load_seconds = m.build_seconds;
                        prov.built_by = format!("{} on {}", m.built_by, m.host);
                        prov.built_at = m.created_at;
                        return Ok((cluster, Source::Restored(m.load)));
                    }
                    Err(Error::DatasetCorrupt { detail, .. }) => {
                        tracing::warn!(dataset = %fp, %detail, "discarding a corrupt dataset; building it again");
                        dataset::discard(&env.datasets, &m, cancel).await?;
                        prov.discarded = Some(detail);
                    }
                    Err(e) => return Err(e),
                }
            }
        }
    }
}

/// Provisions the cell's cluster on a volume made from the dataset snapshot
/// for this cell alone (`hydrate::Snapshot::take_volume`): its blocks are
/// read first (hydration, `storage.hydrate`), then the dataset's PGDATA
/// becomes the cluster's by a rename (`dataset::adopt`): nothing is copied.
/// The volume's store no longer holds the dataset afterwards.
async fn in_place(
    snap: &crate::hydrate::Snapshot,
    v: crate::hydrate::CellVolume,
    spec: &ClusterSpec,
    prov: &mut crate::dataset::Provenance,
    events: &mpsc::Sender<AgentMessage>,
    cell: &str,
    cancel: &CancellationToken,
) -> Result<(Cluster, Source)> {
    let m = &v.manifest;
    let fp = &m.fingerprint;
    prov.hydration = Some(
        snap.hydrate_volume(
            &v,
            cell,
            |done, total| {
                let message = format!(
                    "hydrating dataset {fp} on this cell's volume (from snapshot {})",
                    snap.name
                );
                let _ = events.try_send(transfer(cell, "hydrate", done, total, message));
            },
            cancel,
        )
        .await?,
    );
    let _ = events.try_send(progress(
        cell,
        "dataset",
        &format!("using dataset {fp} in place on {}", v.root.display()),
    ));
    let spec = ClusterSpec {
        clusters_dir: v.root.join("clusters"),
        ..spec.clone()
    };
    let (src, owner) = (v.store().path(fp).join("data"), spec.run_as.clone());
    let mut seconds = 0.0;
    let cluster = Cluster::provision_restored(&spec, &m.superuser_password, |data| {
        let (src, owner, seconds) = (&src, owner.as_ref(), &mut seconds);
        async move {
            let started = std::time::Instant::now();
            crate::dataset::adopt(m, src, &data, owner).await?;
            *seconds = started.elapsed().as_secs_f64();
            Ok(())
        }
    })
    .await?;
    if let Err(e) = v.store().discard(fp) {
        tracing::warn!(dataset = %fp, "removing the adopted dataset's manifest from {}: {e}", v.root.display());
    }
    prov.how = "restored".into();
    prov.method = "in-place".into();
    prov.store = v.store().dir.display().to_string();
    prov.bytes = m.bytes;
    prov.restore_seconds = seconds;
    prov.load_seconds = m.build_seconds;
    prov.built_by = format!("{} on {}", m.built_by, m.host);
    prov.built_at = m.created_at;
    Ok((cluster, Source::Restored(m.load.clone())))
}

/// Uploads the dataset just published locally to the remote store, before
/// the measurement (it would compete for the disk and the network). A
/// failed upload is noted; the cell goes on.
async fn upload(
    remote: &crate::remote::Remote,
    env: &AgentEnv,
    fp: &str,
    prov: &mut crate::dataset::Provenance,
    ctx: &CellContext<'_>,
) -> Result<()> {
    ctx.progress(
        "dataset",
        0,
        0,
        format!("uploading dataset {fp} to {}", remote.url),
    );
    // Under the shared lock: no one replaces it while it is read.
    let lock = loop {
        match env.datasets.try_lock(fp, false) {
            Ok(Some(l)) => break l,
            Ok(None) => tokio::time::sleep(std::time::Duration::from_millis(100)).await,
            Err(e) => {
                return Err(Error::io(
                    format!("dataset store {}", env.datasets.dir.display()),
                    e,
                ));
            }
        }
    };
    let manifest = env
        .datasets
        .find(fp)
        .map_err(|e| Error::io(format!("dataset store {}", env.datasets.dir.display()), e))?;
    let Some(m) = manifest else {
        return Ok(());
    };
    match remote.upload(&env.datasets, &m, &ctx.cancel).await {
        Ok(t) => {
            prov.upload_seconds = t.seconds;
            prov.uploaded_bytes = t.compressed_bytes;
        }
        Err(e @ Error::Cancelled(_)) => return Err(e),
        Err(e) => {
            tracing::warn!(dataset = %fp, "uploading to the remote dataset store: {e}");
            prov.remote_error = Some(format!("upload: {e}"));
        }
    }
    drop(lock);
    Ok(())
}

/// Downloads dataset `fp` from the remote store into the local one (the
/// caller holds its exclusive lock): true when it is published locally. A
/// remote copy that does not match its manifest is removed from the remote
/// store (the cell then builds it, and uploads the new one); a remote store
/// that cannot be reached is noted and the cell builds it.
async fn fetch(
    remote: &crate::remote::Remote,
    env: &AgentEnv,
    fp: &str,
    prov: &mut crate::dataset::Provenance,
    events: &mpsc::Sender<AgentMessage>,
    cell: &str,
    cancel: &CancellationToken,
) -> Result<bool> {
    let found = match remote.find(fp).await {
        Ok(Some(rm)) => rm,
        Ok(None) => return Ok(false),
        Err(e) => {
            tracing::warn!(dataset = %fp, "remote dataset store: {e}; building it here");
            prov.remote_error = Some(e.to_string());
            return Ok(false);
        }
    };
    let _ = events.try_send(progress(
        cell,
        "dataset",
        &format!(
            "downloading dataset {fp} ({}, {} compressed) from {}",
            approx_bytes(found.manifest.bytes),
            approx_bytes(found.compressed_bytes),
            remote.url
        ),
    ));
    let downloaded = remote
        .download(
            &found,
            &env.datasets,
            |done, total| {
                let message = format!("downloading dataset {fp}");
                let _ = events.try_send(transfer(cell, "download", done, total, message));
            },
            cancel,
        )
        .await;
    match downloaded {
        Ok(t) => {
            prov.download_seconds = t.seconds;
            prov.download_mb_per_s = t.raw_bytes as f64 / 1e6 / t.seconds.max(1e-9);
            Ok(true)
        }
        Err(Error::DatasetCorrupt { detail, .. }) => {
            tracing::warn!(dataset = %fp, %detail, "discarding a corrupt remote dataset; building it again");
            if let Err(e) = remote.discard(fp).await {
                tracing::warn!(dataset = %fp, "removing the corrupt remote dataset: {e}");
            }
            prov.discarded = Some(format!("the copy in {}: {detail}", remote.url));
            Ok(false)
        }
        Err(e @ Error::Cancelled(_)) => Err(e),
        Err(e) => {
            tracing::warn!(dataset = %fp, "downloading from the remote dataset store: {e}; building it here");
            prov.remote_error = Some(e.to_string());
            Ok(false)
        }
    }
}

/// Loads the cell's data (or takes a restored dataset's figures) and, for
/// a build, publishes it.
async fn load_dataset(
    env: &AgentEnv,
    ctx: &CellContext<'_>,
    params: &Params,
    source: Source,
    wanted: Option<&crate::dataset::Wanted>,
    mut prov: Option<&mut crate::dataset::Provenance>,
    warm: bool,
) -> Result<workload::Loaded> {
    let load = |ctx| {
        workload::load(ctx, params).ok_or_else(|| Error::Workload {
            workload: params.kind().name().into(),
            message: "this kind declares a dataset but has no loader".into(),
        })
    };
    let loaded = match source {
        Source::Restored(figures) => serde_json::from_value(figures).map_err(|e| {
            Error::Provision(format!("the dataset's manifest has no load figures: {e}"))
        })?,
        Source::Load => return load(ctx)?.await,
        // As the previous cell left it: no rewarm.
        Source::Reused(loaded) => return Ok(*loaded),
        Source::Build(lock) => {
            let loaded = load(ctx)?.await?;
            let (Some(prov), Some(w)) = (prov.as_deref_mut(), wanted) else {
                return Ok(loaded);
            };
            let fp = &w.fingerprint;
            prov.load_seconds = loaded.load_seconds;
            ctx.progress("dataset", 0, 0, format!("publishing dataset {fp}"));
            let published = crate::dataset::publish(
                &env.datasets,
                lock,
                ctx.cluster,
                crate::dataset::Build {
                    wanted: w,
                    cell_id: &ctx.cell_id,
                    load_seconds: loaded.load_seconds,
                    load: serde_json::to_value(&loaded).unwrap_or_default(),
                },
                |done, total| {
                    ctx.progress("publish", done, total, format!("publishing dataset {fp}"))
                },
                &ctx.cancel,
            )
            .await?;
            match published {
                Ok(copied) => {
                    prov.publish_seconds = copied.seconds;
                    prov.bytes = copied.bytes;
                    if let Some(remote) = env.remote.as_deref() {
                        upload(remote, env, fp, prov, ctx).await?;
                    }
                }
                Err(why) => {
                    tracing::warn!(dataset = %fp, %why, "dataset not published");
                    prov.not_published = Some(why);
                }
            }
            loaded
        }
    };
    // Built (its files evicted by the publish) or restored (written by the
    // agent, evicted): read back through the server, as a load leaves them.
    if let Some(prov) = prov.filter(|_| warm) {
        ctx.progress(
            "dataset",
            0,
            0,
            "reading the dataset back into the page cache",
        );
        let started = std::time::Instant::now();
        match crate::dataset::rewarm(ctx.cluster).await? {
            Some(bytes) => {
                prov.cache = "rewarmed".into();
                prov.rewarm_bytes = bytes;
                prov.rewarm_seconds = started.elapsed().as_secs_f64();
            }
            None => prov.cache = "evicted (no pg_prewarm)".into(),
        }
    }
    Ok(loaded)
}

/// Refuses a cell whose estimated disk need exceeds the free space under the
/// data root, before anything is written.
fn check_disk(dir: &std::path::Path, params: &Params) -> Result<()> {
    let need = params
        .estimate(&pgfleet_proto::workload::Capacity::host())
        .disk_bytes;
    let free = host::free_bytes(dir)
        .map_err(|e| Error::io(format!("free space under {}", dir.display()), e))?;
    if free < need {
        return Err(Error::Provision(format!(
            "this {} cell needs about {} of disk under {} (data, indexes and WAL, estimated from its parameters) but only {} is free: free space there, give the agent a larger data root, or lower the scale / size",
            params.kind(),
            approx_bytes(need),
            dir.display(),
            approx_bytes(free)
        )));
    }
    Ok(())
}

fn progress(cell_id: &str, phase: &str, message: &str) -> AgentMessage {
    transfer(cell_id, phase, 0, 0, message.to_string())
}

/// Progress of a phase that moves bytes (a restore, a download).
fn transfer(cell_id: &str, phase: &str, done: u64, total: u64, message: String) -> AgentMessage {
    AgentMessage {
        msg: Some(Msg::Progress(CellProgress {
            cell_id: cell_id.to_string(),
            phase: phase.to_string(),
            done,
            total,
            message,
        })),
    }
}

/// PostgreSQL version and the settings that matter, storage, host.
async fn collect_environment(
    env: &AgentEnv,
    cluster: &Cluster,
    spec: &ClusterSpec,
) -> Result<Environment> {
    let client = cluster.connect().await?;
    let version: String = client.query_one("SHOW server_version", &[]).await?.get(0);
    let mut names: Vec<String> = [
        "shared_buffers",
        "effective_cache_size",
        "work_mem",
        "max_wal_size",
        "default_toast_compression",
        "block_size",
        "wal_level",
        "fsync",
        "synchronous_commit",
        "track_io_timing",
        "track_wal_io_timing",
        // 18's asynchronous I/O (absent before 18: not listed).
        "io_method",
        "io_workers",
        "data_checksums",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    names.extend(spec.settings.keys().cloned());
    names.sort();
    names.dedup();
    let rows = client
        .query("SELECT name, current_setting(name) FROM pg_settings WHERE name = ANY($1) ORDER BY name", &[&names])
        .await?;
    let settings = rows
        .iter()
        .map(|r| (r.get::<_, String>(0), r.get::<_, String>(1)))
        .collect();
    let cgroups: Vec<String> = cluster
        .cgroups()
        .iter()
        .map(|c| c.display().to_string())
        .collect();
    Ok(Environment {
        postgres: environment::Postgres {
            version,
            settings,
            bin_dir: Some(cluster.pg.dir.display().to_string()),
            port: Some(cluster.port()),
            build: environment::build_options(&cluster.pg.configure()),
        },
        storage: environment::Storage {
            profile: env.storage_profile.clone(),
            emulated: env.emulated,
            data_root: Some(env.data_root.display().to_string()),
            caps: env.caps,
            // The caps hold on the cluster's own device, or else on its
            // block-I/O cgroup (the first it joined).
            cgroup: cgroups
                .first()
                .filter(|_| env.emulated && env.caps.is_capped())
                .filter(|_| cluster.capped_device().is_none())
                .cloned(),
            device: cluster.capped_device().map(str::to_string),
            delivered: None,
        },
        instance: environment::Instance {
            instance_type: env.instance.instance_type.clone(),
            memory_bytes: env.instance.memory_bytes,
            cpus: env.instance.cpus,
            emulated: env.instance.emulated,
            cgroups,
        },
        host: environment::Host {
            hostname: host::hostname(),
            cores: u64::from(host::cores()),
            memory_bytes: host::memory_bytes(),
        },
        // Who ran what: scenario SQL as the workload role (a superuser only
        // with allow_shell), the agent's own steps as its superuser.
        roles: Some(environment::Roles {
            scenario_sql: crate::cluster::WORKLOAD_ROLE.into(),
            scenario_sql_superuser: spec.allow_shell,
            agent_steps: crate::cluster::SUPERUSER.into(),
        }),
        dataset: None,
    })
}
