//! The Kubernetes agent source: for each agent of a run, a
//! PersistentVolumeClaim of its class's storage class and a Pod running the
//! agent image on a node of its class's instance type, one agent per node.
//!
//! Every object of a run is owned (`ownerReferences`) by one ConfigMap,
//! `pgfleet-run-<run id>`: deleting it (foreground propagation) makes the
//! garbage collector delete the run's pods and volumes, whatever else
//! happened. The source deletes it when the run ends; `serve` deletes those
//! of runs that are not running when it starts (`reap`).
//!
//! The source watches its pods, so that nothing waits for a lease or hangs:
//! a pod that fails, is evicted or deleted makes its agent lost at once
//! (`Event::Gone`), and a pod still Pending after the pending timeout
//! (unschedulable, image pull failure, volume not bound) is given up with
//! the reason read from its conditions, container states and events.
//!
//! Datasets as CSI snapshots (`--dataset-snapshots STORAGECLASS=SNAPSHOTCLASS`):
//! at a run's end, the volume of each agent whose store gained a dataset
//! (built there, or downloaded into it) is snapshotted — after its pod
//! exited, before the run's owner (and the volume) is deleted, waiting for
//! the snapshot to be cut — into a VolumeSnapshot that outlives the run,
//! labelled by storage class and annotated with the datasets it holds. A
//! later run's agent of that storage class whose cells need one of them
//! gets a volume created from the newest ready snapshot holding the most
//! (`dataSource`), and is told so (`PGFLEET_VOLUME_SNAPSHOT`): it reads the
//! datasets in full before the first cell uses one (hydration), since such
//! a volume fetches each block lazily on first touch.
//!
//! The requests it makes, and so the verbs `deploy/base/rbac.yaml` grants:
//! configmaps create, list, delete; persistentvolumeclaims create; pods
//! create, list, watch; events list; volumesnapshots list, create, get,
//! delete.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Event as KubeEvent, PersistentVolumeClaim, Pod};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams,
};
use kube::runtime::watcher;
use kube::runtime::{WatchStreamExt, watcher::Event as WatchEvent};
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::{AgentSource, Held, Launched, RunEnd};
use crate::events::Event;
use pgfleet_proto::workload::Invalid;
use pgfleet_scenario::plan::{Holdings, Stores};
use pgfleet_scenario::{Cleanup, FleetEntry, Scenario};

/// The node label of the instance type (set by the cloud provider).
pub const INSTANCE_TYPE_LABEL: &str = "node.kubernetes.io/instance-type";
/// The agent image's `postgres` user and group (deploy/images/agent.Dockerfile):
/// the pod runs as it and owns its volume.
pub const AGENT_UID: i64 = 10001;
/// How long an agent's pod waits for an absent controller before it tears
/// down (its run is then resumed by the restarted controller).
const AGENT_GIVE_UP_S: u64 = 600;
/// The port of an agent pod's own /metrics (named `metrics`).
pub const AGENT_METRICS_PORT: u16 = 9187;
/// Where the volume is mounted in the agent's pod (its data root).
const DATA_ROOT: &str = "/data";
const CA_DIR: &str = "/var/run/pgfleet/ca";
const DEFAULT_VOLUME_BYTES: u64 = 10 << 30;

/// How runs' agents are put on the cluster.
#[derive(Debug, Clone)]
pub struct KubeOptions {
    /// Where the run's objects go (the controller's own namespace).
    pub namespace: String,
    /// The agent image, e.g. `registry.example/pgfleet-agent:0.1.0`.
    pub image: String,
    pub image_pull_policy: String,
    /// What agents dial: the controller Service's gRPC address.
    pub controller_url: String,
    /// The Secret holding the join token under key `join-token`
    /// (deploy/base's `pgfleet-tokens`).
    pub token_secret: String,
    /// A Secret holding the controller's CA under key `ca.pem`, for an
    /// https:// controller URL.
    pub ca_secret: Option<String>,
    /// How long a pod may stay Pending before its agent is given up.
    pub pending_timeout: Duration,
    /// How long the end of a run waits for agents to exit on their own
    /// before it deletes their pods.
    pub exit_grace: Duration,
    /// The agents' object store for datasets (`--dataset-remote`), and the
    /// Secret whose keys are its credentials in the pods' environment.
    pub dataset_remote: Option<String>,
    pub dataset_remote_secret: Option<String>,
    /// StorageClass -> VolumeSnapshotClass: agents' volumes of these
    /// storage classes keep their datasets as CSI snapshots (see the
    /// module's comment).
    pub dataset_snapshots: BTreeMap<String, String>,
    /// How long the end of a run waits for its snapshots to be cut (their
    /// `status.creationTime`) before it deletes the volumes.
    pub snapshot_cut_timeout: Duration,
}

impl Default for KubeOptions {
    fn default() -> Self {
        KubeOptions {
            namespace: "pgfleet".into(),
            image: "pgfleet-agent:dev".into(),
            image_pull_policy: "IfNotPresent".into(),
            controller_url: "http://pgfleet-controller.pgfleet.svc:7070".into(),
            token_secret: "pgfleet-tokens".into(),
            ca_secret: None,
            pending_timeout: Duration::from_secs(600),
            exit_grace: Duration::from_secs(60),
            dataset_remote: None,
            dataset_remote_secret: None,
            dataset_snapshots: BTreeMap::new(),
            snapshot_cut_timeout: Duration::from_secs(600),
        }
    }
}

/// One agent's objects.
#[derive(Debug, Clone)]
pub struct AgentObjects {
    pub launched: Launched,
    pub pvc: PersistentVolumeClaim,
    /// Volumes made from a dataset snapshot for one cell each (`from_snapshots`).
    pub cell_pvcs: Vec<PersistentVolumeClaim>,
    pub pod: Pod,
}

/// Everything a run creates: the owner, then per agent a volume and a pod.
#[derive(Debug, Clone)]
pub struct RunObjects {
    pub owner: ConfigMap,
    pub agents: Vec<AgentObjects>,
}

impl RunObjects {
    /// The objects as `kubectl apply` (and `--dry-run=server`) takes them.
    /// An owner reference needs its owner's uid, which exists only once
    /// the owner is created: the volumes and pods are shown without theirs,
    /// and a comment says what pgfleet adds.
    pub fn to_yaml(&self) -> String {
        let mut docs = vec![to_value(&self.owner)];
        for a in &self.agents {
            docs.push(to_value(&a.pvc));
            docs.push(to_value(&a.pod));
        }
        let owner = self.owner.metadata.name.clone().unwrap_or_default();
        docs.iter_mut()
            .map(|d| {
                let owned = d["metadata"]
                    .as_object_mut()
                    .and_then(|m| m.remove("ownerReferences"))
                    .is_some();
                let note = if owned {
                    format!("# pgfleet sets ownerReferences to ConfigMap {owner}'s uid when it creates this\n")
                } else {
                    String::new()
                };
                format!("---\n{note}{}", serde_saphyr::to_string(d).unwrap_or_default())
            })
            .collect()
    }
}

/// A summary of a plan for people: agents per node pool and volumes.
pub fn describe(objects: &RunObjects) -> String {
    // (class, instance type, storage class, size) -> agents
    let mut pools: BTreeMap<(String, String, String, String), usize> = BTreeMap::new();
    for a in &objects.agents {
        let spec = a.pod.spec.clone().unwrap_or_default();
        let node = match spec.node_selector {
            Some(s) if !s.is_empty() => format!(
                "nodes {}",
                s.iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            _ => "any node".into(),
        };
        let pvc = a.pvc.spec.clone().unwrap_or_default();
        let class = pvc.storage_class_name.unwrap_or_else(|| "(default)".into());
        let size = pvc
            .resources
            .and_then(|r| r.requests)
            .and_then(|r| r.get("storage").map(|q| q.0.clone()))
            .unwrap_or_default();
        *pools
            .entry((a.launched.instance_class.clone(), node, class, size))
            .or_default() += 1;
    }
    let nodes: std::collections::BTreeSet<&String> = pools.keys().map(|k| &k.1).collect();
    let mut out = format!(
        "{} agents on {} node pool{}, one per node, each with its own volume:\n",
        objects.agents.len(),
        nodes.len(),
        if nodes.len() == 1 { "" } else { "s" }
    );
    for ((class, node, storage, size), n) in &pools {
        out.push_str(&format!(
            "  {class}: {n} pod{} on {node}, {size} volume{} of storage class {storage}\n",
            if *n == 1 { "" } else { "s" },
            if *n == 1 { "" } else { "s" },
        ));
    }
    out.push_str(&format!(
        "all owned by ConfigMap {}: deleting it deletes them\n",
        objects.owner.metadata.name.clone().unwrap_or_default()
    ));
    out
}

fn to_value<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

fn from_value<T: serde::de::DeserializeOwned>(v: Value) -> T {
    // The values are built below from fixed shapes; a mismatch is a bug.
    serde_json::from_value(v).expect("a well-formed Kubernetes object")
}

/// The owner object's name for a run.
pub fn owner_name(run_id: &str) -> String {
    format!("pgfleet-run-{}", dns_label(run_id))
}

/// Lower case, `_` and other characters to `-`: a DNS label's alphabet.
fn dns_label(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect::<String>()
        .trim_matches('-')
        .to_string()
}

fn labels(run_id: &str, component: &str, class: Option<&str>) -> BTreeMap<String, String> {
    let mut l = BTreeMap::from([
        (
            "app.kubernetes.io/name".to_string(),
            format!("pgfleet-{component}"),
        ),
        (
            "app.kubernetes.io/part-of".to_string(),
            "pgfleet".to_string(),
        ),
        (
            "app.kubernetes.io/managed-by".to_string(),
            "pgfleet".to_string(),
        ),
        (
            "app.kubernetes.io/component".to_string(),
            component.to_string(),
        ),
        (
            "app.kubernetes.io/version".to_string(),
            env!("CARGO_PKG_VERSION").to_string(),
        ),
        ("pgfleet.io/run".to_string(), run_id.to_string()),
    ]);
    if let Some(c) = class {
        l.insert("pgfleet.io/class".into(), c.to_string());
    }
    l
}

/// The label selector of a run's pods.
pub fn run_selector(run_id: &str) -> String {
    format!("pgfleet.io/run={run_id},app.kubernetes.io/component=agent")
}

/// The label selector of every run's owner.
pub const OWNER_SELECTOR: &str =
    "app.kubernetes.io/managed-by=pgfleet,app.kubernetes.io/component=run";

/// A Kubernetes quantity for a size in bytes: `600Gi`, `512Mi`, or bytes.
fn quantity(bytes: u64) -> String {
    if bytes >= 1 << 30 && bytes.is_multiple_of(1 << 30) {
        format!("{}Gi", bytes >> 30)
    } else if bytes.is_multiple_of(1 << 20) && bytes > 0 {
        format!("{}Mi", bytes >> 20)
    } else {
        bytes.to_string()
    }
}

/// CPUs as a quantity: `15`, `500m`.
fn cpu_quantity(cpus: f64) -> String {
    let milli = (cpus * 1000.0).round() as u64;
    if milli.is_multiple_of(1000) {
        (milli / 1000).to_string()
    } else {
        format!("{milli}m")
    }
}

/// The objects a run creates on the cluster, from its scenario; Err where
/// the scenario asks for what a pod cannot do (located, like validation).
pub fn plan(sc: &Scenario, run_id: &str, opts: &KubeOptions) -> Result<RunObjects, Invalid> {
    let owner_name = owner_name(run_id);
    let owner: ConfigMap = from_value(json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": owner_name,
            "namespace": opts.namespace,
            "labels": labels(run_id, "run", None),
        },
        "data": { "run": run_id, "scenario": sc.name.value },
    }));
    let mut agents = Vec::new();
    for (i, f) in sc.fleet.value.iter().enumerate() {
        refuse_emulation(i, f)?;
        for n in 0..f.count() {
            agents.push(agent_objects(f, run_id, n, &owner_name, opts));
        }
    }
    refuse_partitions(sc)?;
    Ok(RunObjects { owner, agents })
}

/// A `partition` fault writes firewall rules in the subscriber agent's
/// network namespace, which needs root and CAP_NET_ADMIN: an agent's pod
/// runs as its own user with every capability dropped.
fn refuse_partitions(sc: &Scenario) -> Result<(), Invalid> {
    for (i, w) in sc.workloads.value.iter().enumerate() {
        if let Some((j, kind)) = w.spec.fault_kinds().find(|(_, k)| k.value == "partition") {
            return Err(Invalid {
                at: kind.referenced,
                field: format!("workloads[{i}].faults[{j}].kind"),
                message: "a partition cuts the network with firewall rules in the subscriber agent's namespace, which needs root and CAP_NET_ADMIN; an agent's pod runs as its own user with every capability dropped: run the scenario with local agents (`pgfleet run`), or drop the fault".into(),
                value_line: 0,
            });
        }
    }
    Ok(())
}

/// Pods cannot throttle block I/O or set memory cgroups for their
/// clusters: on Kubernetes the volume and the node are the real thing.
fn refuse_emulation(i: usize, f: &FleetEntry) -> Result<(), Invalid> {
    if let Some(st) = &f.storage
        && f.emulate()
        && f.caps().is_capped()
    {
        return Err(Invalid {
            at: st.profile.referenced,
            field: format!("fleet[{i}].storage.emulate"),
            message: format!(
                "profile `{}` is emulated by throttling block I/O, which an agent's pod cannot do: on Kubernetes the storage class sets the volume's limits; add `emulate: false` (and `storage_class:`)",
                st.profile.value
            ),
            value_line: 0,
        });
    }
    let inst = f.instance();
    if let Some(spec) = &f.instance
        && inst.emulate
        && (inst.memory_bytes > 0 || inst.cpus > 0)
    {
        let at = spec
            .memory
            .as_ref()
            .map(|m| m.referenced)
            .or(spec.cpus.as_ref().map(|c| c.referenced))
            .unwrap_or(f.name.referenced);
        return Err(Invalid {
            at,
            field: format!("fleet[{i}].instance.emulate"),
            message: "an instance's memory and CPUs are emulated with cgroups, which an agent's pod cannot set up: on Kubernetes the node is the instance (`instance.type` selects its node pool); add `emulate: false` or remove `memory`/`cpus`".into(),
            value_line: 0,
        });
    }
    Ok(())
}

fn agent_objects(
    f: &FleetEntry,
    run_id: &str,
    n: u32,
    owner: &str,
    opts: &KubeOptions,
) -> AgentObjects {
    let class = &f.name.value;
    let name = format!("pgfleet-{}-{}-{n}", dns_label(run_id), dns_label(class));
    let owner_ref = json!([{
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": owner,
        "uid": "",
        "controller": true,
        "blockOwnerDeletion": true,
    }]);
    let pvc = data_claim(f, &name, run_id, &owner_ref, opts);
    let place = Placement::of(f);
    let (env, mounts, volumes) = agent_environment(f, &name, opts);
    let mut spec = json!({
        "restartPolicy": "Never",
        "automountServiceAccountToken": false,
        // The agent stops its clusters on SIGTERM; a checkpoint of a large
        // shared_buffers takes a while.
        "terminationGracePeriodSeconds": 120,
        "securityContext": {
            "runAsUser": AGENT_UID,
            "runAsGroup": AGENT_UID,
            "fsGroup": AGENT_UID,
            "runAsNonRoot": true,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        // Each cluster alone on its instance, as in the seeds: no two
        // pgfleet agents (of any run) on one node.
        "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
            "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "pgfleet-agent"}},
            "topologyKey": "kubernetes.io/hostname",
        }]}},
        "containers": [{
            "name": "agent",
            "image": opts.image,
            "imagePullPolicy": opts.image_pull_policy,
            // A controller restarted by its Deployment (Recreate: the old
            // pod goes first, the new one may wait for its volume) is away
            // longer than on a host: the agent keeps its cell meanwhile.
            // Its own /metrics on the pod's IP (a PodMonitor scrapes the
            // `metrics` port; the controller lists it at /sd/agents too).
            "args": [
                "--give-up-after-s", AGENT_GIVE_UP_S.to_string(),
                "--metrics-addr", format!("0.0.0.0:{AGENT_METRICS_PORT}"),
            ],
            "ports": [{"name": "metrics", "containerPort": AGENT_METRICS_PORT, "protocol": "TCP"}],
            "env": env,
            "resources": {"requests": {"cpu": cpu_quantity(place.cpu), "memory": quantity(place.memory)}},
            "volumeMounts": mounts,
            "securityContext": {
                "allowPrivilegeEscalation": false,
                "capabilities": {"drop": ["ALL"]},
            },
        }],
        "volumes": volumes,
    });
    if let Some(secret) = &opts.dataset_remote_secret {
        spec["containers"][0]["envFrom"] = json!([{"secretRef": {"name": secret}}]);
    }
    if !place.node_selector.is_empty() {
        spec["nodeSelector"] = json!(place.node_selector);
    }
    if !place.tolerations.is_empty() {
        spec["tolerations"] = json!(place.tolerations);
    }
    let mut pod_labels = labels(run_id, "agent", Some(class));
    pod_labels.insert("pgfleet.io/storage-profile".into(), f.profile());
    let pod: Pod = from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": opts.namespace,
            "labels": pod_labels,
            // A node autoscaler (Karpenter) must not consolidate a node
            // away from under a benchmark.
            "annotations": {"karpenter.sh/do-not-disrupt": "true"},
            "ownerReferences": owner_ref,
        },
        "spec": spec,
    }));
    AgentObjects {
        launched: Launched {
            agent_id: name,
            instance_class: class.clone(),
        },
        pvc,
        cell_pvcs: Vec::new(),
        pod,
    }
}

/// The agent's data volume: the class's storage class and size.
fn data_claim(
    f: &FleetEntry,
    name: &str,
    run_id: &str,
    owner_ref: &Value,
    opts: &KubeOptions,
) -> PersistentVolumeClaim {
    let class = &f.name.value;
    let storage = f.storage.as_ref();
    let size = storage
        .and_then(|s| s.size.as_ref())
        .and_then(|s| s.value.bytes().ok())
        .unwrap_or(DEFAULT_VOLUME_BYTES);
    let mut pvc_spec = json!({
        "accessModes": ["ReadWriteOnce"],
        "resources": { "requests": { "storage": quantity(size) } },
    });
    if let Some(sc) = storage.and_then(|s| s.storage_class.as_ref()) {
        pvc_spec["storageClassName"] = json!(sc.value);
    }
    from_value(json!({
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": format!("{name}-data"),
            "namespace": opts.namespace,
            "labels": labels(run_id, "agent-data", Some(class)),
            "ownerReferences": owner_ref,
        },
        "spec": pvc_spec,
    }))
}

/// Where the agent's pod may run and what it asks for: the class's node
/// selector (with its instance type), tolerations and requests.
struct Placement {
    node_selector: BTreeMap<String, String>,
    tolerations: Vec<Value>,
    cpu: f64,
    memory: u64,
}

impl Placement {
    fn of(f: &FleetEntry) -> Placement {
        let inst = f.instance();
        let kube = f.kubernetes.clone().unwrap_or_default();
        let mut node_selector: BTreeMap<String, String> = kube
            .node_selector
            .iter()
            .map(|(k, v)| (k.clone(), v.value.clone()))
            .collect();
        if !inst.instance_type.is_empty() {
            node_selector.insert(INSTANCE_TYPE_LABEL.into(), inst.instance_type.clone());
        }
        let requests = kube.requests.unwrap_or_default();
        let cpu = requests.cpu.map(|c| c.value).unwrap_or(1.0);
        let memory = requests
            .memory
            .and_then(|m| m.value.bytes().ok())
            .unwrap_or(1 << 30);
        let tolerations: Vec<Value> = kube
            .tolerations
            .iter()
            .map(|t| {
                let mut v = json!({});
                let put = |v: &mut Value, k: &str, x: &Option<serde_saphyr::Spanned<String>>| {
                    if let Some(x) = x {
                        v[k] = json!(x.value);
                    }
                };
                put(&mut v, "key", &t.key);
                put(&mut v, "operator", &t.operator);
                put(&mut v, "value", &t.value);
                put(&mut v, "effect", &t.effect);
                v
            })
            .collect();
        Placement {
            node_selector,
            tolerations,
            cpu,
            memory,
        }
    }
}

/// The agent container's environment, mounts and the pod's volumes: the
/// controller to join, its identity and class, the join token from its
/// secret, the dataset store, the CA.
fn agent_environment(
    f: &FleetEntry,
    name: &str,
    opts: &KubeOptions,
) -> (Vec<Value>, Vec<Value>, Vec<Value>) {
    let class = &f.name.value;
    let inst = f.instance();
    let storage = f.storage.as_ref();
    let mut env = vec![
        json!({"name": "PGFLEET_CONTROLLER", "value": opts.controller_url}),
        json!({"name": "PGFLEET_AGENT_ID", "value": name}),
        json!({"name": "PGFLEET_INSTANCE_CLASS", "value": class}),
        json!({"name": "PGFLEET_STORAGE_PROFILE", "value": f.profile()}),
        json!({"name": "PGFLEET_INSTANCE_TYPE", "value": inst.instance_type}),
        json!({"name": "PGFLEET_DATA_ROOT", "value": DATA_ROOT}),
        // The join token as an environment variable, not a file: the agent
        // reads it once and removes it; PostgreSQL, which runs as the same
        // uid here, could read a mounted file (SECURITY.md, "In pods").
        json!({"name": "PGFLEET_JOIN_TOKEN", "valueFrom": {"secretKeyRef": {
            "name": opts.token_secret, "key": "join-token",
        }}}),
        json!({"name": "PGFLEET_ADVERTISE_ADDRESS",
               "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}),
    ];
    // The class's PostgreSQL version, which the agent image must carry
    // (deploy/images: the images are built with the versions asked for).
    if let Some(v) = f.postgres.as_ref().and_then(|p| p.version.as_ref()) {
        env.push(json!({"name": "PGFLEET_PG_VERSION", "value": v.value.to_string()}));
    }
    if let Some(url) = &opts.dataset_remote {
        env.push(json!({"name": "PGFLEET_DATASET_REMOTE", "value": url}));
    }
    if let Some(h) = storage.and_then(|s| s.hydrate.as_ref()) {
        env.push(json!({"name": "PGFLEET_HYDRATE", "value": h.value}));
    }
    let mut mounts = vec![json!({"name": "data", "mountPath": DATA_ROOT})];
    let mut volumes = vec![
        json!({"name": "data", "persistentVolumeClaim": {"claimName": format!("{name}-data")}}),
    ];
    if let Some(ca) = &opts.ca_secret {
        env.push(json!({"name": "PGFLEET_CA", "value": format!("{CA_DIR}/ca.pem")}));
        mounts.push(json!({"name": "ca", "mountPath": CA_DIR, "readOnly": true}));
        volumes.push(json!({"name": "ca", "secret": {
            "secretName": ca, "items": [{"key": "ca.pem", "path": "ca.pem"}],
        }}));
    }
    (env, mounts, volumes)
}

/// The agents a run's plan launches, for the hub to expect before the pods
/// exist (a fast agent must find its run). Err: see `plan`.
pub fn planned_agents(
    sc: &Scenario,
    run_id: &str,
    opts: &KubeOptions,
) -> Result<Vec<Launched>, Invalid> {
    Ok(plan(sc, run_id, opts)?
        .agents
        .into_iter()
        .map(|a| a.launched)
        .collect())
}

/// What the watcher knows of one pod.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodState {
    pub phase: String,
    /// Given up (failed, deleted, or Pending too long): reported once.
    pub gone: bool,
}

impl KubeOptions {
    /// Where the pods keep datasets: each on its run's volume, unless an
    /// object store stands behind them all.
    pub fn dataset_stores(&self) -> Stores {
        if self.dataset_remote.is_some() {
            Stores::Shared
        } else {
            Stores::PerAgent
        }
    }
}

/// A run's agents on Kubernetes.
pub struct KubeAgents {
    client: kube::Client,
    opts: KubeOptions,
    run_id: String,
    launched: Vec<Launched>,
    pods: watch::Receiver<HashMap<String, PodState>>,
    stop_watch: CancellationToken,
    cleanup: Cleanup,
    /// Per agent: its volume's storage class (where the scenario names one).
    storage_classes: BTreeMap<String, String>,
}

/// The owner ConfigMap's annotation on a kept run: when serve deletes it.
pub const KEEP_UNTIL: &str = "pgfleet.io/keep-until";

impl KubeAgents {
    /// Creates the run's owner, then each agent's volume and pod, and
    /// starts watching the pods. On an error, what was created is deleted.
    pub async fn launch(
        client: kube::Client,
        sc: &Scenario,
        run_id: &str,
        opts: &KubeOptions,
        events: mpsc::Sender<Event>,
    ) -> pgfleet_store::Result<KubeAgents> {
        let objects = plan(sc, run_id, opts)
            .map_err(|e| pgfleet_store::Error::Agents(format!("{}: {}", e.field, e.message)))?;
        let ns = &opts.namespace;
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
        let pp = PostParams::default();
        let owner = cms.create(&pp, &objects.owner).await.map_err(|e| {
            pgfleet_store::Error::Agents(format!(
                "creating ConfigMap {ns}/{}: {}",
                owner_name(run_id),
                kube_hint(&e)
            ))
        })?;
        let uid = owner.metadata.uid.clone().unwrap_or_default();
        let mut objects = objects;
        if !opts.dataset_snapshots.is_empty() {
            from_snapshots(&client, sc, opts, &mut objects.agents).await;
        }
        let mut me = KubeAgents::watch(
            client.clone(),
            run_id,
            opts,
            objects.agents.iter().map(|a| a.launched.clone()).collect(),
            events,
            sc.cleanup(),
        );
        me.storage_classes = storage_classes(&objects.agents);
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        for mut a in objects.agents {
            let claims = std::iter::once(&mut a.pvc).chain(a.cell_pvcs.iter_mut());
            let refs = claims
                .map(|c| &mut c.metadata)
                .chain([&mut a.pod.metadata])
                .flat_map(|m| m.owner_references.iter_mut().flatten());
            for r in refs {
                r.uid = uid.clone();
            }
            let mut created = Ok(());
            for claim in std::iter::once(&a.pvc).chain(&a.cell_pvcs) {
                if let Err(e) = pvcs.create(&pp, claim).await {
                    created = Err(("PersistentVolumeClaim", e));
                    break;
                }
            }
            if created.is_ok() {
                created = pods
                    .create(&pp, &a.pod)
                    .await
                    .map(|_| ())
                    .map_err(|e| ("Pod", e));
            }
            if let Err((kind, e)) = created {
                let mut me = me;
                me.stop(false).await;
                return Err(pgfleet_store::Error::Agents(format!(
                    "creating {kind} for agent {}: {}",
                    a.launched.agent_id,
                    kube_hint(&e)
                )));
            }
        }
        Ok(me)
    }

    /// Takes over a run launched by an earlier controller (a resumed run):
    /// watches its pods and deletes (or keeps) its objects when it ends.
    /// (Which snapshot its volumes came from is not known again: a
    /// snapshot at its end lists only the datasets gained.)
    pub fn attach(
        client: kube::Client,
        run_id: &str,
        opts: &KubeOptions,
        agents: Vec<Launched>,
        events: mpsc::Sender<Event>,
        sc: &Scenario,
    ) -> KubeAgents {
        let mut me = KubeAgents::watch(client, run_id, opts, agents, events, sc.cleanup());
        if let Ok(objects) = plan(sc, run_id, opts) {
            me.storage_classes = storage_classes(&objects.agents);
        }
        me
    }

    fn watch(
        client: kube::Client,
        run_id: &str,
        opts: &KubeOptions,
        launched: Vec<Launched>,
        events: mpsc::Sender<Event>,
        cleanup: Cleanup,
    ) -> KubeAgents {
        let (state_tx, state_rx) = watch::channel(HashMap::new());
        let stop = CancellationToken::new();
        tokio::spawn(watch_pods(
            client.clone(),
            opts.clone(),
            run_id.to_string(),
            launched.iter().map(|l| l.agent_id.clone()).collect(),
            events,
            state_tx,
            stop.clone(),
        ));
        KubeAgents {
            client,
            opts: opts.clone(),
            run_id: run_id.to_string(),
            launched,
            pods: state_rx,
            stop_watch: stop,
            cleanup,
            storage_classes: BTreeMap::new(),
        }
    }

    /// The run's end by `cleanup:`: its objects deleted, or kept with a
    /// `pgfleet.io/keep-until` annotation on their owner (serve's reaper
    /// deletes them then). What was kept, for the report.
    pub async fn end(&mut self, end: RunEnd) -> Option<serde_json::Value> {
        let succeeded = end.succeeded;
        self.snapshot_datasets(&end.gained).await;
        let c = self.cleanup;
        if !(if succeeded {
            c.keep_on_success
        } else {
            c.keep_on_failure
        }) {
            self.stop(true).await;
            return None;
        }
        self.wait_exit().await;
        self.stop_watch.cancel();
        let ns = &self.opts.namespace;
        let owner = owner_name(&self.run_id);
        let until = chrono::Utc::now()
            + chrono::Duration::from_std(c.ttl).unwrap_or(chrono::Duration::hours(24));
        let until = until.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let cms: Api<ConfigMap> = Api::namespaced(self.client.clone(), ns);
        let patch = json!({"metadata": {"annotations": {KEEP_UNTIL: until}}});
        if let Err(e) = cms
            .patch(&owner, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            // Nothing may be left unaccounted for: delete after all.
            tracing::error!(
                "keeping {ns}/{owner}: {}; deleting it instead",
                kube_hint(&e)
            );
            delete_owner(&self.client, ns, &owner).await;
            return None;
        }
        let mut objects = vec![format!("configmap/{owner}")];
        for l in &self.launched {
            objects.push(format!("pod/{}", l.agent_id));
            objects.push(format!("persistentvolumeclaim/{}-data", l.agent_id));
        }
        tracing::info!(run = %self.run_id, "kept {} objects until {until} (cleanup: keep)", objects.len());
        Some(json!({"until": until, "namespace": ns, "owner": owner, "objects": objects}))
    }

    /// Snapshots the volume of each agent whose store gained a dataset in
    /// this run (its storage class mapped to a snapshot class), after its
    /// pod ended, and waits (bounded) until each snapshot is cut, so that
    /// deleting the volumes next loses nothing. A snapshot that fails or is
    /// not cut in time is deleted and said. Then the snapshots the new
    /// ones (or others) supersede are deleted (`superseded`). Returns the
    /// snapshots made.
    pub async fn snapshot_datasets(&mut self, gained: &BTreeMap<String, Vec<Held>>) -> Vec<String> {
        let ns = &self.opts.namespace.clone();
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), ns);
        let mut wanted = Vec::new();
        for l in &self.launched {
            let Some(new) = gained.get(&l.agent_id).filter(|g| !g.is_empty()) else {
                continue;
            };
            let Some((sc, class)) = self
                .storage_classes
                .get(&l.agent_id)
                .and_then(|sc| Some((sc, self.opts.dataset_snapshots.get(sc)?)))
            else {
                continue;
            };
            // What the volume came with (its annotation, set when it was
            // made from a snapshot: read back, so a resumed run knows too).
            let volume = format!("{}-data", l.agent_id);
            let mut held: Vec<Held> = match pvcs.get(&volume).await {
                Ok(pvc) => pvc
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(DATASETS_ANNOTATION))
                    .and_then(|a| serde_json::from_str(a).ok())
                    .unwrap_or_default(),
                Err(e) => {
                    tracing::warn!(
                        "reading {ns}/{volume}: {}; its snapshot lists only the datasets this run added",
                        kube_hint(&e)
                    );
                    Vec::new()
                }
            };
            for h in new {
                if !held.iter().any(|x| x.fingerprint == h.fingerprint) {
                    held.push(h.clone());
                }
            }
            wanted.push((l.agent_id.clone(), sc.clone(), class.clone(), held));
        }
        if wanted.is_empty() {
            return Vec::new();
        }
        // Quiesced: the agents stopped their clusters and exited.
        self.wait_exit().await;
        let api = snapshot_api(&self.client, ns);
        let mut made = Vec::new();
        for (agent, sc, class, held) in wanted {
            let name = format!("{agent}-datasets");
            let mut l = labels(&self.run_id, "dataset-snapshot", None);
            l.insert("pgfleet.io/storage-class".into(), sc.clone());
            let obj = json!({
                "apiVersion": "snapshot.storage.k8s.io/v1",
                "kind": "VolumeSnapshot",
                "metadata": {
                    "name": name,
                    "namespace": ns,
                    "labels": l,
                    "annotations": {DATASETS_ANNOTATION: serde_json::to_string(&held).unwrap_or_default()},
                },
                "spec": {
                    "volumeSnapshotClassName": class,
                    "source": {"persistentVolumeClaimName": format!("{agent}-data")},
                },
            });
            match api.create(&PostParams::default(), &from_value(obj)).await {
                Ok(_) => made.push(name),
                Err(e) => tracing::error!(
                    run = %self.run_id,
                    "snapshotting {agent}'s datasets ({}): {}; later runs will build or download them again",
                    held.iter().map(|h| h.fingerprint.as_str()).collect::<Vec<_>>().join(", "),
                    kube_hint(&e)
                ),
            }
        }
        let deadline = Instant::now() + self.opts.snapshot_cut_timeout;
        let mut pending: BTreeSet<String> = made.iter().cloned().collect();
        let mut failed = Vec::new();
        while !pending.is_empty() {
            for name in pending.clone() {
                match api.get(&name).await {
                    Ok(o) if o.data["status"]["error"]["message"].is_string() => {
                        failed.push((
                            name.clone(),
                            o.data["status"]["error"]["message"].to_string(),
                        ));
                        pending.remove(&name);
                    }
                    Ok(o)
                        if !o.data["status"]["creationTime"].is_null()
                            || o.data["status"]["readyToUse"] == true =>
                    {
                        pending.remove(&name);
                    }
                    Ok(_) => {}
                    Err(e) => {
                        failed.push((name.clone(), kube_hint(&e)));
                        pending.remove(&name);
                    }
                }
            }
            if pending.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                for name in std::mem::take(&mut pending) {
                    failed.push((
                        name,
                        format!("not cut within {:?}", self.opts.snapshot_cut_timeout),
                    ));
                }
                break;
            }
            tokio::time::sleep(SNAPSHOT_POLL).await;
        }
        for (name, why) in &failed {
            tracing::error!(run = %self.run_id, "volume snapshot {ns}/{name}: {why}; deleting it (later runs build or download its datasets again)");
            if let Err(e) = api.delete(name, &DeleteParams::default()).await {
                tracing::error!(
                    "deleting volume snapshot {ns}/{name}: {}; delete it by hand",
                    kube_hint(&e)
                );
            }
            made.retain(|m| m != name);
        }
        for name in &made {
            tracing::info!(run = %self.run_id, "kept the datasets of volume {name} as VolumeSnapshot {ns}/{name}: later runs' volumes of its storage class start from it");
        }
        match dataset_snapshots(&self.client, ns).await {
            Ok(found) => {
                for old in superseded(&found) {
                    match api.delete(&old.name, &DeleteParams::default()).await {
                        Ok(_) => tracing::info!(
                            "deleted VolumeSnapshot {ns}/{}: a newer ready snapshot of {} holds its datasets",
                            old.name,
                            old.storage_class
                        ),
                        Err(e) => tracing::warn!(
                            "deleting superseded VolumeSnapshot {ns}/{}: {}",
                            old.name,
                            kube_hint(&e)
                        ),
                    }
                }
            }
            Err(e) => tracing::warn!("listing dataset snapshots in {ns} to prune them: {e}"),
        }
        made
    }

    /// Waits (bounded) for the agents, told to shut down, to end their pods.
    async fn wait_exit(&mut self) {
        let ids: Vec<String> = self.launched.iter().map(|l| l.agent_id.clone()).collect();
        let all_done = move |m: &HashMap<String, PodState>| {
            ids.iter().all(|id| {
                m.get(id).is_none_or(|p| {
                    p.gone || matches!(p.phase.as_str(), "Succeeded" | "Failed" | "Pending" | "")
                })
            })
        };
        let _ = tokio::time::timeout(self.opts.exit_grace, self.pods.wait_for(all_done)).await;
    }

    /// Waits (bounded, when `wait`) for the agents, told to shut down, to
    /// end their pods; then deletes the run's owner, and with it everything.
    async fn stop(&mut self, wait: bool) {
        if wait {
            self.wait_exit().await;
        }
        self.stop_watch.cancel();
        delete_owner(
            &self.client,
            &self.opts.namespace,
            &owner_name(&self.run_id),
        )
        .await;
    }
}

impl AgentSource for KubeAgents {
    fn launched(&self) -> Vec<Launched> {
        self.launched.clone()
    }

    fn shutdown(&mut self) -> BoxFuture<'_, ()> {
        self.stop(true).boxed()
    }

    fn finish(&mut self, end: RunEnd) -> BoxFuture<'_, Option<serde_json::Value>> {
        self.end(end).boxed()
    }
}

/// Each agent's volume's storage class, where the scenario names one.
fn storage_classes(agents: &[AgentObjects]) -> BTreeMap<String, String> {
    agents
        .iter()
        .filter_map(|a| {
            let sc = a.pvc.spec.as_ref()?.storage_class_name.clone()?;
            Some((a.launched.agent_id.clone(), sc))
        })
        .collect()
}

/// The annotation of a dataset snapshot listing the datasets it holds
/// (JSON: `[Held]`).
pub const DATASETS_ANNOTATION: &str = "pgfleet.io/datasets";
const SNAPSHOT_POLL: Duration = Duration::from_secs(2);

fn snapshot_api(client: &kube::Client, ns: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("snapshot.storage.k8s.io", "v1", "VolumeSnapshot");
    let ar = ApiResource::from_gvk_with_plural(&gvk, "volumesnapshots");
    Api::namespaced_with(client.clone(), ns, &ar)
}

/// A dataset snapshot pgfleet made (a VolumeSnapshot it labelled).
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    pub name: String,
    pub storage_class: String,
    pub ready: bool,
    /// `status.restoreSize` in bytes: a volume made from it is no smaller.
    pub restore_bytes: u64,
    pub created: String,
    pub datasets: Vec<Held>,
}

impl Snapshot {
    fn of(o: &DynamicObject) -> Option<Snapshot> {
        let m = &o.metadata;
        Some(Snapshot {
            name: m.name.clone()?,
            storage_class: m.labels.as_ref()?.get("pgfleet.io/storage-class")?.clone(),
            ready: o.data["status"]["readyToUse"] == true,
            restore_bytes: o.data["status"]["restoreSize"]
                .as_str()
                .and_then(parse_quantity)
                .unwrap_or(0),
            created: m
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.to_string())
                .unwrap_or_default(),
            datasets: serde_json::from_str(m.annotations.as_ref()?.get(DATASETS_ANNOTATION)?)
                .ok()?,
        })
    }
}

/// Bytes of a Kubernetes quantity (`100Gi`, `5368709120`, `10G`).
pub fn parse_quantity(q: &str) -> Option<u64> {
    let q = q.trim();
    let split = q.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(q.len());
    let (n, unit) = q.split_at(split);
    let n: f64 = n.parse().ok()?;
    let mult: f64 = match unit {
        "" => 1.0,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        _ => return None,
    };
    Some((n * mult).ceil() as u64)
}

/// The snapshots another makes useless: for each, a ready snapshot of its
/// storage class, newer, holds every dataset it holds (a snapshot still
/// being cut supersedes none; one in use by a volume being restored is
/// kept by the snapshot controller until that ends).
pub fn superseded(found: &[Snapshot]) -> Vec<&Snapshot> {
    let with_fps: Vec<(&Snapshot, BTreeSet<&str>)> = found
        .iter()
        .map(|s| {
            (
                s,
                s.datasets.iter().map(|d| d.fingerprint.as_str()).collect(),
            )
        })
        .collect();
    with_fps
        .iter()
        .filter(|(old, old_fps)| {
            with_fps.iter().any(|(new, new_fps)| {
                new.ready
                    && new.storage_class == old.storage_class
                    && (&new.created, &new.name) > (&old.created, &old.name)
                    && new_fps.is_superset(old_fps)
            })
        })
        .map(|(s, _)| *s)
        .collect()
}

/// The snapshot a volume of storage class `sc` whose cells need the
/// datasets `needs` (plan keys) starts from: a ready one of that class
/// holding the most of them, the newest of those; None if none holds any.
pub fn choose<'a>(
    found: &'a [Snapshot],
    sc: &str,
    needs: &BTreeSet<String>,
) -> Option<&'a Snapshot> {
    found
        .iter()
        .filter(|s| s.ready && s.storage_class == sc)
        .map(|s| {
            let n = s
                .datasets
                .iter()
                .filter(|d| needs.contains(&d.plan_key))
                .count();
            (n, s)
        })
        .filter(|(n, _)| *n > 0)
        .max_by(|(n1, a), (n2, b)| n1.cmp(n2).then_with(|| a.created.cmp(&b.created)))
        .map(|(_, s)| s)
}

/// The dataset snapshots pgfleet made in namespace `ns`.
pub async fn dataset_snapshots(client: &kube::Client, ns: &str) -> Result<Vec<Snapshot>, String> {
    let selector =
        "app.kubernetes.io/managed-by=pgfleet,app.kubernetes.io/component=dataset-snapshot";
    snapshot_api(client, ns)
        .list(&ListParams::default().labels(selector))
        .await
        .map(|l| l.items.iter().filter_map(Snapshot::of).collect())
        .map_err(|e| kube_hint(&e))
}

/// By instance class, the snapshot its agents' volumes start from: for a
/// class whose storage class keeps dataset snapshots
/// (`--dataset-snapshots`) and whose cells need a dataset, the one `choose`
/// picks among `found`.
pub fn chosen_snapshots<'a>(
    sc: &Scenario,
    opts: &KubeOptions,
    found: &'a [Snapshot],
) -> BTreeMap<String, &'a Snapshot> {
    let mut needs: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for c in pgfleet_scenario::plan::plan(sc) {
        if let Some(share) = &c.share {
            needs
                .entry(c.dataset_class().to_string())
                .or_default()
                .insert(share.key.clone());
        }
    }
    let mut chosen = BTreeMap::new();
    for f in &sc.fleet.value {
        let Some(storage_class) = f
            .storage
            .as_ref()
            .and_then(|s| s.storage_class.as_ref())
            .map(|c| c.value.as_str())
            .filter(|c| opts.dataset_snapshots.contains_key(*c))
        else {
            continue;
        };
        let Some(need) = needs.get(&f.name.value) else {
            continue;
        };
        if let Some(snap) = choose(found, storage_class, need) {
            chosen.insert(f.name.value.clone(), snap);
        }
    }
    chosen
}

/// What a run's pods' stores hold at its start, for its plan: with an
/// object store, one store for them all (its contents are not listed:
/// estimated as builds); else one per pod, whose volume starts with the
/// datasets of the snapshot `chosen_snapshots` picks for its class.
pub fn holdings(sc: &Scenario, opts: &KubeOptions, found: &[Snapshot]) -> Holdings {
    match opts.dataset_stores() {
        Stores::Shared => Holdings::default(),
        Stores::PerAgent => {
            let mut held = Holdings::per_agent(
                chosen_snapshots(sc, opts, found)
                    .into_iter()
                    .map(|(class, snap)| {
                        let held = snap.datasets.iter().map(|d| (d.plan_key.clone(), d.bytes));
                        (class, held.collect())
                    })
                    .collect(),
            );
            held.cell_volumes = pgfleet_scenario::plan::restores_per_agent(sc, &held)
                .into_iter()
                .map(|(class, n)| (class, n.min(MAX_CELL_VOLUMES)))
                .collect();
            held.snapshotted = sc
                .fleet
                .value
                .iter()
                .filter(|f| {
                    f.storage
                        .as_ref()
                        .and_then(|s| s.storage_class.as_ref())
                        .is_some_and(|c| opts.dataset_snapshots.contains_key(&c.value))
                })
                .map(|f| f.name.value.clone())
                .collect();
            held
        }
    }
}

/// Volumes made from a dataset snapshot for one cell each that an agent's
/// pod gets at most (past them, cells restore by copy from its data
/// volume): a node attaches a few dozen volumes at most (EBS on Nitro
/// instances shares its attachment limit with network interfaces and
/// instance store), and the node's other pods need some.
pub const MAX_CELL_VOLUMES: u32 = 8;
/// Where an agent's pod mounts its cell volumes: `<dir>/<n>`.
const CELL_VOLUMES_DIR: &str = "/cells";

/// The snapshots a run of `sc` would leave for the next (`validate
/// --kubernetes` has no cluster to list): one per class whose storage class
/// keeps dataset snapshots, holding every dataset its cells need.
pub fn assumed_snapshots(sc: &Scenario, opts: &KubeOptions) -> Vec<Snapshot> {
    let mut needs: BTreeMap<String, BTreeMap<String, Held>> = BTreeMap::new();
    for c in pgfleet_scenario::plan::plan(sc) {
        let (Some(share), Some(d)) = (&c.share, c.params.dataset()) else {
            continue;
        };
        let held = Held {
            fingerprint: format!("{}-assumed", d.label),
            plan_key: share.key.clone(),
            label: d.label.clone(),
            bytes: d.pgdata_bytes(),
        };
        let class = needs.entry(c.dataset_class().to_string()).or_default();
        class.insert(share.key.clone(), held);
    }
    sc.fleet
        .value
        .iter()
        .filter_map(|f| {
            let storage_class = f.storage.as_ref()?.storage_class.as_ref()?.value.clone();
            opts.dataset_snapshots.get(&storage_class)?;
            let datasets: Vec<Held> = needs.get(&f.name.value)?.values().cloned().collect();
            Some(Snapshot {
                name: format!("{}-assumed", f.name.value),
                storage_class,
                ready: true,
                restore_bytes: datasets.iter().map(|d| d.bytes).sum(),
                created: String::new(),
                datasets,
            })
        })
        .collect()
}

/// Gives each agent whose storage class keeps dataset snapshots a volume
/// made from the snapshot holding its class's datasets, if there is one
/// (`choose`), annotated with them, and tells its pod; and as many more
/// volumes of that snapshot as the plan has it restore cells of them
/// (`Holdings::cell_volumes`), one per cell, which the agent uses in place
/// (`--cell-volume`). A snapshot list that fails is said and the run goes
/// on without (its cells build or download their data).
async fn from_snapshots(
    client: &kube::Client,
    sc: &Scenario,
    opts: &KubeOptions,
    agents: &mut [AgentObjects],
) {
    let ns = &opts.namespace;
    let found = match dataset_snapshots(client, ns).await {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!(
                "listing dataset snapshots in {ns}: {e}; this run's volumes start empty"
            );
            return;
        }
    };
    let chosen = chosen_snapshots(sc, opts, &found);
    let cell_volumes = holdings(sc, opts, &found).cell_volumes;
    for a in agents.iter_mut() {
        let class = &a.launched.instance_class;
        let Some(snap) = chosen.get(class) else {
            continue;
        };
        let mut pvc = to_value(&a.pvc);
        pvc["metadata"]["annotations"][DATASETS_ANNOTATION] =
            json!(serde_json::to_string(&snap.datasets).unwrap_or_default());
        pvc["spec"]["dataSource"] = json!({
            "apiGroup": "snapshot.storage.k8s.io",
            "kind": "VolumeSnapshot",
            "name": snap.name,
        });
        let asked = pvc["spec"]["resources"]["requests"]["storage"]
            .as_str()
            .and_then(parse_quantity)
            .unwrap_or(0);
        if snap.restore_bytes > asked {
            pvc["spec"]["resources"]["requests"]["storage"] = json!(quantity(snap.restore_bytes));
        }
        let mut pod = to_value(&a.pod);
        let n = cell_volumes.get(class).copied().unwrap_or(0);
        let mut mounted = Vec::new();
        for i in 0..n {
            let mut cell = pvc.clone();
            let name = format!("{}-cell-{i}", a.launched.agent_id);
            cell["metadata"]["name"] = json!(name);
            cell["metadata"]["labels"]["app.kubernetes.io/component"] = json!("agent-cell-data");
            a.cell_pvcs.push(from_value(cell));
            let path = format!("{CELL_VOLUMES_DIR}/{i}");
            let volume = format!("cell-{i}");
            if let Some(v) = pod["spec"]["volumes"].as_array_mut() {
                v.push(json!({"name": volume, "persistentVolumeClaim": {"claimName": name}}));
            }
            if let Some(m) = pod["spec"]["containers"][0]["volumeMounts"].as_array_mut() {
                m.push(json!({"name": volume, "mountPath": path}));
            }
            mounted.push(path);
        }
        a.pvc = from_value(pvc);
        if let Some(env) = pod["spec"]["containers"][0]["env"].as_array_mut() {
            env.push(json!({"name": "PGFLEET_VOLUME_SNAPSHOT", "value": snap.name}));
            if !mounted.is_empty() {
                env.push(json!({"name": "PGFLEET_CELL_VOLUMES", "value": mounted.join(",")}));
            }
        }
        a.pod = from_value(pod);
        tracing::info!(
            agent = %a.launched.agent_id,
            "volume from VolumeSnapshot {ns}/{} ({})",
            snap.name,
            snap.datasets.iter().map(|d| d.fingerprint.as_str()).collect::<Vec<_>>().join(", ")
        );
    }
}

/// Deletes a run's owner with foreground propagation: the garbage collector
/// deletes its pods and volumes, then the owner.
async fn delete_owner(client: &kube::Client, ns: &str, name: &str) {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    match cms.delete(name, &DeleteParams::foreground()).await {
        Ok(_) => tracing::info!("deleted {ns}/{name} and, by propagation, its pods and volumes"),
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => tracing::error!(
            "deleting {ns}/{name}: {}; delete it by hand (`kubectl -n {ns} delete configmap {name} --cascade=foreground`)",
            kube_hint(&e)
        ),
    }
}

/// Deletes the objects of runs that are not running (their controller was
/// killed before it could): every owner whose run the store does not have
/// as running. Returns the runs reaped.
pub async fn reap(
    client: &kube::Client,
    ns: &str,
    running: impl Fn(&str) -> bool,
) -> pgfleet_store::Result<Vec<String>> {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let owners = cms
        .list(&ListParams::default().labels(OWNER_SELECTOR))
        .await
        .map_err(|e| {
            pgfleet_store::Error::Agents(format!(
                "listing runs' objects in {ns}: {}",
                kube_hint(&e)
            ))
        })?;
    let mut reaped = Vec::new();
    for cm in owners {
        let Some(run) = cm
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("pgfleet.io/run"))
            .cloned()
        else {
            continue;
        };
        if running(&run) {
            continue;
        }
        // Kept for debugging (`cleanup: keep`) until its time.
        let until = cm
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(KEEP_UNTIL))
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok());
        if until.is_some_and(|t| t > chrono::Utc::now()) {
            continue;
        }
        if let Some(name) = &cm.metadata.name {
            delete_owner(client, ns, name).await;
            reaped.push(run);
        }
    }
    Ok(reaped)
}

/// An API error with what to do about the usual ones.
fn kube_hint(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if s.code == 403 => format!(
            "{}: the controller's ServiceAccount lacks a permission; apply deploy/base/role.yaml",
            s.message
        ),
        kube::Error::Api(s) if s.code == 404 && s.message.contains("namespaces") => {
            format!("{}: create the namespace, or pass --namespace", s.message)
        }
        kube::Error::Api(s) => format!("{} ({})", s.message, s.reason),
        e => e.to_string(),
    }
}

/// Follows a run's pods until stopped; reports each agent that is gone.
async fn watch_pods(
    client: kube::Client,
    opts: KubeOptions,
    run_id: String,
    agents: Vec<String>,
    events: mpsc::Sender<Event>,
    state: watch::Sender<HashMap<String, PodState>>,
    stop: CancellationToken,
) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &opts.namespace);
    let kube_events: Api<KubeEvent> = Api::namespaced(client, &opts.namespace);
    let cfg = watcher::Config::default().labels(&run_selector(&run_id));
    let mut stream = watcher(pods, cfg).default_backoff().boxed();
    let started = Instant::now();
    // Pods not seen Running yet, and since when (launch time).
    let mut pending: HashMap<String, Instant> =
        agents.iter().map(|a| (a.clone(), started)).collect();
    let mut last: HashMap<String, Pod> = HashMap::new();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        let ev = tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => None,
            ev = stream.next() => match ev {
                Some(ev) => Some(ev),
                None => return,
            },
        };
        let mut gone: Vec<(String, String)> = Vec::new();
        match ev {
            Some(Ok(WatchEvent::Apply(p) | WatchEvent::InitApply(p))) => {
                let name = p.metadata.name.clone().unwrap_or_default();
                let phase = p
                    .status
                    .as_ref()
                    .and_then(|s| s.phase.clone())
                    .unwrap_or_default();
                if phase != "Pending" && !phase.is_empty() {
                    pending.remove(&name);
                }
                if let Some(why) = pod_ended(&p) {
                    gone.push((name.clone(), why));
                }
                state.send_modify(|m| m.entry(name.clone()).or_default().phase = phase);
                last.insert(name, p);
            }
            Some(Ok(WatchEvent::Delete(p))) => {
                let name = p.metadata.name.clone().unwrap_or_default();
                gone.push((name.clone(), format!("pod {name} was deleted")));
                last.remove(&name);
            }
            Some(Ok(WatchEvent::Init | WatchEvent::InitDone)) => {}
            Some(Err(e)) => tracing::warn!(run = %run_id, "watching the run's pods: {e}"),
            None => {
                let now = Instant::now();
                let late: Vec<String> = pending
                    .iter()
                    .filter(|(_, since)| now.duration_since(**since) > opts.pending_timeout)
                    .map(|(n, _)| n.clone())
                    .collect();
                for name in late {
                    pending.remove(&name);
                    let why = pending_reason(last.get(&name), &kube_events, &name).await;
                    gone.push((
                        name.clone(),
                        format!(
                            "pod {name} still Pending after {:?}: {why}",
                            opts.pending_timeout
                        ),
                    ));
                }
            }
        }
        for (name, why) in gone {
            let first = {
                let mut first = false;
                state.send_modify(|m| {
                    let p = m.entry(name.clone()).or_default();
                    first = !p.gone;
                    p.gone = true;
                });
                first
            };
            pending.remove(&name);
            if first && agents.contains(&name) {
                tracing::warn!(run = %run_id, "{why}");
                let _ = events
                    .send(Event::Gone {
                        agent_id: name,
                        why,
                    })
                    .await;
            }
        }
    }
}

/// Why a pod's agent is gone for good, if it is: the pod failed or ended,
/// or is being deleted (evicted through the API, or by hand).
fn pod_ended(p: &Pod) -> Option<String> {
    let name = p.metadata.name.clone().unwrap_or_default();
    if p.metadata.deletion_timestamp.is_some() {
        return Some(format!("pod {name} is being deleted"));
    }
    let st = p.status.as_ref()?;
    let phase = st.phase.as_deref().unwrap_or_default();
    if phase != "Failed" && phase != "Succeeded" {
        return None;
    }
    let mut why = format!("pod {name} {}", phase.to_lowercase());
    if let Some(r) = &st.reason {
        why.push_str(&format!(": {r}"));
    }
    if let Some(m) = &st.message {
        why.push_str(&format!(": {m}"));
    }
    for c in st.container_statuses.iter().flatten() {
        if let Some(t) = c.state.as_ref().and_then(|s| s.terminated.as_ref()) {
            why.push_str(&format!(
                "; container {} {} (exit code {})",
                c.name,
                t.reason.as_deref().unwrap_or("terminated"),
                t.exit_code
            ));
            if let Some(m) = &t.message {
                why.push_str(&format!(": {m}"));
            }
        }
    }
    Some(why)
}

/// Why a pod is still Pending: its unmet conditions, its containers'
/// waiting reasons (ErrImagePull...), and its latest warning events
/// (FailedScheduling, FailedMount, ProvisioningFailed...).
async fn pending_reason(p: Option<&Pod>, kube_events: &Api<KubeEvent>, name: &str) -> String {
    let mut why = Vec::new();
    let Some(p) = p else {
        return "the pod was never seen (was it created?)".into();
    };
    if let Some(st) = &p.status {
        for c in st.conditions.iter().flatten() {
            if c.status == "False" {
                why.push(format!(
                    "{}: {}{}",
                    c.type_,
                    c.reason.as_deref().unwrap_or("False"),
                    c.message
                        .as_deref()
                        .map(|m| format!(": {m}"))
                        .unwrap_or_default()
                ));
            }
        }
        for c in st.container_statuses.iter().flatten() {
            if let Some(w) = c.state.as_ref().and_then(|s| s.waiting.as_ref()) {
                why.push(format!(
                    "container {} waiting: {}{}",
                    c.name,
                    w.reason.as_deref().unwrap_or("?"),
                    w.message
                        .as_deref()
                        .map(|m| format!(": {m}"))
                        .unwrap_or_default()
                ));
            }
        }
    }
    let lp = ListParams::default().fields(&format!("involvedObject.name={name}"));
    if let Ok(list) = kube_events.list(&lp).await {
        let mut warnings: Vec<&KubeEvent> = list
            .items
            .iter()
            .filter(|e| e.type_.as_deref() == Some("Warning"))
            .collect();
        warnings.sort_by_key(|e| e.last_timestamp.clone().map(|t| t.0));
        if let Some(e) = warnings.last() {
            why.push(format!(
                "event {}: {}",
                e.reason.as_deref().unwrap_or("?"),
                e.message.as_deref().unwrap_or("")
            ));
        }
    }
    if why.is_empty() {
        "no condition or event says why".into()
    } else {
        why.join("; ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A snapshot is pruned when a newer ready one of its storage class
    /// holds all its datasets; of two alike made in one second, the first
    /// by name goes, never both.
    #[test]
    fn snapshots_superseded_by_a_newer_ready_one_of_their_class() {
        let held = |fp: &str| Held {
            fingerprint: fp.into(),
            plan_key: fp.into(),
            label: fp.into(),
            bytes: 1,
        };
        let snap = |name: &str, sc: &str, ready: bool, created: &str, fps: &[&str]| Snapshot {
            name: name.into(),
            storage_class: sc.into(),
            ready,
            restore_bytes: 0,
            created: created.into(),
            datasets: fps.iter().map(|f| held(f)).collect(),
        };
        let found = [
            snap("a", "gp3", true, "2026-12-01T00:00:00Z", &["x"]),
            snap("b", "gp3", true, "2026-12-02T00:00:00Z", &["x", "y"]),
            snap("c", "gp3", true, "2026-12-02T00:00:00Z", &["x", "y"]),
            snap("d", "gp3", false, "2026-12-03T00:00:00Z", &["x", "y", "z"]),
            snap("e", "io2", true, "2026-11-01T00:00:00Z", &["x"]),
            snap("f", "gp3", true, "2026-11-01T00:00:00Z", &["z"]),
        ];
        let names: Vec<&str> = superseded(&found).iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
    }

    /// `--dataset-remote` reaches each agent pod, with its credentials from
    /// the named Secret as environment; without it, the pods carry neither.
    #[test]
    fn the_dataset_remote_and_its_secret_reach_the_pods() {
        let sc = pgfleet_scenario::parse(
            std::path::Path::new("k.yaml"),
            "name: k\nfleet: [{name: a}]\nworkloads: [{kind: pgbench, scale: 1}]\n",
        )
        .unwrap();
        let container = |opts: &KubeOptions| {
            let objects = plan(&sc, "r1", opts).unwrap();
            serde_json::to_value(&objects.agents[0].pod).unwrap()["spec"]["containers"][0].clone()
        };
        let plain = container(&KubeOptions::default());
        assert!(plain["envFrom"].is_null(), "{plain}");
        assert!(!plain["env"].to_string().contains("PGFLEET_DATASET_REMOTE"));
        let c = container(&KubeOptions {
            dataset_remote: Some("s3://b/p".into()),
            dataset_remote_secret: Some("pgfleet-s3".into()),
            ..KubeOptions::default()
        });
        assert_eq!(c["envFrom"], json!([{"secretRef": {"name": "pgfleet-s3"}}]));
        let env = c["env"].as_array().unwrap();
        assert!(
            env.contains(&json!({"name": "PGFLEET_DATASET_REMOTE", "value": "s3://b/p"})),
            "{env:?}"
        );
    }

    /// `storage.hydrate` reaches the agent (`--hydrate`); a bad one is a
    /// located error.
    #[test]
    fn hydrate_reaches_the_pods_and_a_bad_mode_is_refused() {
        let sc = |hydrate: &str| {
            pgfleet_scenario::parse(
                std::path::Path::new("k.yaml"),
                &format!(
                    "name: k\nfleet:\n  - name: a\n    storage: {{profile: gp3, emulate: false, storage_class: gp3, hydrate: {hydrate}}}\nworkloads: [{{kind: pgbench, scale: 1}}]\n"
                ),
            )
        };
        let objects = plan(&sc("none").unwrap(), "r1", &KubeOptions::default()).unwrap();
        let env =
            serde_json::to_value(&objects.agents[0].pod).unwrap()["spec"]["containers"][0]["env"]
                .clone();
        assert!(
            env.as_array()
                .unwrap()
                .contains(&json!({"name": "PGFLEET_HYDRATE", "value": "none"})),
            "{env}"
        );
        let e = sc("lazy").unwrap_err();
        assert_eq!(e.field, "fleet[0].storage.hydrate", "{e}");
        assert_eq!(e.line, 4, "{e}");
        assert!(e.message.contains("read-all"), "{e}");
    }

    /// A partition cannot run in a pod: refused at planning, located at
    /// the fault's kind; the drain without it plans.
    #[test]
    fn a_partition_is_refused_on_kubernetes() {
        let path = std::path::Path::new("k.yaml");
        let yaml = |faults: &str| {
            format!(
                "name: k\nfleet:\n  - name: a\n  - name: b\nworkloads:\n  - kind: logical-drain\n    on: [a]\n    roles: {{publisher: b}}\n    scale: 1\n    backlog_bytes: 16MB\n{faults}"
            )
        };
        let cut = yaml("    faults:\n      - {kind: partition, at_s: 2, duration_s: 3}\n");
        let sc = pgfleet_scenario::parse(path, &cut).unwrap();
        let e = plan(&sc, "r1", &KubeOptions::default()).unwrap_err();
        let e = pgfleet_scenario::ScenarioError::located(path, &cut, e);
        assert_eq!(e.field, "workloads[0].faults[0].kind", "{e}");
        assert_eq!(e.line, 12, "{e}");
        assert!(e.message.contains("CAP_NET_ADMIN"), "{e}");
        let sc = pgfleet_scenario::parse(path, &yaml("")).unwrap();
        assert!(plan(&sc, "r1", &KubeOptions::default()).is_ok());
    }

    #[test]
    fn quantities_parse_as_kubernetes_writes_them() {
        assert_eq!(parse_quantity("120Gi"), Some(120 << 30));
        assert_eq!(parse_quantity("1536Mi"), Some(1536 << 20));
        assert_eq!(parse_quantity("10G"), Some(10_000_000_000));
        assert_eq!(parse_quantity("5368709120"), Some(5 << 30));
        assert_eq!(parse_quantity("1.5Ti"), Some(3 << 39));
        assert_eq!(parse_quantity("12Qi"), None);
        assert_eq!(quantity(parse_quantity("120Gi").unwrap()), "120Gi");
    }
}
