//! The Kubernetes agent source, the manifests in deploy/ and the
//! Kubernetes dry run of a scenario.
//!
//! No Kubernetes API server can run on these machines (no registry to pull
//! one from, no kubelet), so the source talks to a FAKE API server here, in
//! the pattern of kube-rs's controller-rs (`src/fixtures.rs`): a tower-test
//! mock service in place of the HTTP connection, and a task that answers
//! each request like the API server would (objects created with uids and
//! resource versions, label-selected lists, a watch stream of the pods'
//! changes, foreground deletion with the garbage collector's propagation to
//! owned objects) and records every request, whose method, path and body the
//! tests then assert. Everything else is real: the scheduler, the store and
//! the gRPC service in `the_run_fails_with_the_reason_*`, `kubectl kustomize`
//! and `kubernetes-validate` (PyPI, the Kubernetes 1.33 schemas) for the
//! manifests, and the `pgfleet` binary for the dry run.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use common::{Scratch, pgfleet, show};
use pgfleet_controller::agents::kubernetes::{self, KubeAgents, KubeOptions};
use pgfleet_controller::agents::{AgentSource, RunEnd};
use pgfleet_controller::events::Event;
use pgfleet_controller::scenario;

const NS: &str = "bench";
const KUBE_VERSION: &str = "1.33.0";

type Body = BoxBody<Bytes, Infallible>;
type Chunk = Result<Frame<Bytes>, Infallible>;

/// One request the source made.
#[derive(Debug, Clone)]
struct Recorded {
    method: String,
    path: String,
    query: String,
    body: Value,
}

#[derive(Default)]
struct State {
    /// (resource, name) -> object
    objects: BTreeMap<(String, String), Value>,
    requests: Vec<Recorded>,
    /// (resource, stream) of each watch.
    watchers: Vec<(String, mpsc::UnboundedSender<Chunk>)>,
    /// Every change sent to watches: (version, resource, line), replayed to
    /// a watch that starts from an older resourceVersion, as the API server
    /// does (a change between a list and its watch is not lost).
    history: Vec<(u64, String, String)>,
    /// core/v1 Events, answered to `involvedObject.name=` field selectors.
    events: Vec<Value>,
    /// resource -> status code: creating one of these fails.
    refuse_create: BTreeMap<String, u16>,
    version: u64,
}

/// The fake API server (see the file's comment).
#[derive(Clone, Default)]
struct FakeApi {
    state: Arc<Mutex<State>>,
}

impl FakeApi {
    /// A client of a new fake API server, and the server.
    fn start() -> (kube::Client, FakeApi) {
        let (service, mut handle) =
            tower_test::mock::pair::<Request<kube::client::Body>, Response<Body>>();
        let fake = FakeApi::default();
        let f = fake.clone();
        tokio::spawn(async move {
            while let Some((req, send)) = handle.next_request().await {
                let f = f.clone();
                tokio::spawn(async move {
                    send.send_response(f.answer(req).await);
                });
            }
        });
        (kube::Client::new(service, NS), fake)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap()
    }

    fn requests(&self) -> Vec<Recorded> {
        self.lock().requests.clone()
    }

    fn object(&self, resource: &str, name: &str) -> Option<Value> {
        self.lock()
            .objects
            .get(&(resource.to_string(), name.to_string()))
            .cloned()
    }

    fn names(&self, resource: &str) -> Vec<String> {
        self.lock()
            .objects
            .keys()
            .filter(|(r, _)| r == resource)
            .map(|(_, n)| n.clone())
            .collect()
    }

    /// Puts an object as if another party (kubelet, a user) had made it.
    fn put(&self, resource: &str, mut obj: Value) {
        let mut st = self.lock();
        st.version += 1;
        obj["metadata"]["resourceVersion"] = json!(st.version.to_string());
        if obj["metadata"]["uid"].is_null() {
            obj["metadata"]["uid"] = json!(format!("uid-{}", st.version));
        }
        let name = obj["metadata"]["name"].as_str().unwrap().to_string();
        st.objects.insert((resource.into(), name), obj.clone());
        if matches!(resource, "pods" | "pgfleetruns") {
            broadcast(&mut st, resource, "ADDED", &obj);
        }
    }

    /// The kubelet (or the scheduler, or an eviction) changes a pod.
    fn update_pod(&self, name: &str, change: impl FnOnce(&mut Value)) {
        let mut st = self.lock();
        st.version += 1;
        let v = st.version.to_string();
        let pod = st
            .objects
            .get_mut(&("pods".to_string(), name.to_string()))
            .unwrap_or_else(|| panic!("no pod {name}"));
        change(pod);
        pod["metadata"]["resourceVersion"] = json!(v);
        let pod = pod.clone();
        broadcast(&mut st, "pods", "MODIFIED", &pod);
    }

    /// Another party (the snapshot controller, say) changes an object.
    fn update(&self, resource: &str, name: &str, change: impl FnOnce(&mut Value)) {
        let mut st = self.lock();
        st.version += 1;
        let v = st.version.to_string();
        let o = st
            .objects
            .get_mut(&(resource.to_string(), name.to_string()))
            .unwrap_or_else(|| panic!("no {resource} {name}"));
        change(o);
        o["metadata"]["resourceVersion"] = json!(v);
    }

    /// Someone deletes a pod (kubectl delete, a node drain).
    fn delete_pod(&self, name: &str) {
        let mut st = self.lock();
        if let Some(pod) = st.objects.remove(&("pods".to_string(), name.to_string())) {
            broadcast(&mut st, "pods", "DELETED", &pod);
        }
    }

    fn add_event(&self, pod: &str, reason: &str, message: &str) {
        self.lock().events.push(json!({
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": format!("{pod}.{reason}"), "namespace": NS},
            "involvedObject": {"kind": "Pod", "name": pod, "namespace": NS},
            "type": "Warning", "reason": reason, "message": message,
            "lastTimestamp": "2026-12-01T10:00:00Z",
        }));
    }

    async fn answer(&self, req: Request<kube::client::Body>) -> Response<Body> {
        let method = req.method().to_string();
        let path = req.uri().path().to_string();
        let query = req.uri().query().unwrap_or_default().to_string();
        let bytes = req.into_body().collect_bytes().await.unwrap_or_default();
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        self.lock().requests.push(Recorded {
            method: method.clone(),
            path: path.clone(),
            query: query.clone(),
            body: body.clone(),
        });
        let q: BTreeMap<String, String> = url_pairs(&query);
        // /api/v1/namespaces/{ns}/{resource}[/{name}[/{subresource}]], or
        // /apis/pgfleet.io/v1alpha1/namespaces/... for the PgfleetRuns.
        let Some(ApiPath {
            resource,
            name,
            subresource,
            ..
        }) = api_path(&path)
        else {
            return status(404, "NotFound", &format!("no route {method} {path}"));
        };
        match (method.as_str(), name) {
            ("POST", None) => self.create(&resource, body),
            ("GET", None) if q.get("watch").is_some_and(|w| w == "true" || w == "1") => {
                let (tx, rx) = mpsc::unbounded_channel();
                let from: u64 = q
                    .get("resourceVersion")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(u64::MAX);
                let mut st = self.lock();
                for (v, r, line) in &st.history {
                    if *v > from && *r == resource {
                        let _ = tx.send(Ok(Frame::data(Bytes::from(line.clone()))));
                    }
                }
                st.watchers.push((resource, tx));
                drop(st);
                let stream = tokio_stream::wrappers::UnboundedReceiverStream::new(rx);
                Response::new(StreamBody::new(stream).boxed())
            }
            ("GET", None) => self.list(&resource, &q),
            ("GET", Some(name)) => match self.object(&resource, &name) {
                Some(o) => json_response(200, &o),
                None => status(404, "NotFound", &format!("{resource} \"{name}\" not found")),
            },
            ("PATCH", Some(name)) => self.patch(&resource, &name, subresource.as_deref(), &body),
            ("DELETE", Some(name)) => self.delete(&resource, &name, &body),
            _ => status(405, "MethodNotAllowed", &format!("{method} {path}")),
        }
    }

    /// A JSON merge patch (RFC 7386), as kube's `Patch::Merge` sends:
    /// refused with 409 when it names a resourceVersion that is not the
    /// object's; on the status subresource only `status` changes, on the
    /// object everything but `status`. An object being deleted goes when
    /// its last finalizer does.
    fn patch(&self, resource: &str, name: &str, sub: Option<&str>, p: &Value) -> Response<Body> {
        let mut st = self.lock();
        st.version += 1;
        let version = st.version.to_string();
        let key = (resource.to_string(), name.to_string());
        let Some(obj) = st.objects.get_mut(&key) else {
            return status(404, "NotFound", &format!("{resource} \"{name}\" not found"));
        };
        if let Some(rv) = p["metadata"]["resourceVersion"].as_str()
            && obj["metadata"]["resourceVersion"] != rv
        {
            return status(
                409,
                "Conflict",
                &format!("the object has been modified; resourceVersion {rv} is stale"),
            );
        }
        let mut p = p.clone();
        if let Some(m) = p["metadata"].as_object_mut() {
            m.remove("resourceVersion");
        }
        let p = match sub {
            Some("status") => json!({"status": p["status"]}),
            Some(other) => return status(404, "NotFound", &format!("no subresource {other}")),
            None => {
                let mut p = p;
                if let Some(o) = p.as_object_mut() {
                    o.remove("status");
                }
                p
            }
        };
        let spec_before = obj["spec"].clone();
        merge(obj, &p);
        if obj["spec"] != spec_before {
            let g = obj["metadata"]["generation"].as_i64().unwrap_or(1);
            obj["metadata"]["generation"] = json!(g + 1);
        }
        obj["metadata"]["resourceVersion"] = json!(version);
        let obj = obj.clone();
        let finalized = !obj["metadata"]["deletionTimestamp"].is_null()
            && obj["metadata"]["finalizers"]
                .as_array()
                .is_none_or(|f| f.is_empty());
        if finalized {
            st.objects.remove(&key);
            broadcast(&mut st, resource, "DELETED", &obj);
        } else {
            broadcast(&mut st, resource, "MODIFIED", &obj);
        }
        json_response(200, &obj)
    }

    fn create(&self, resource: &str, mut obj: Value) -> Response<Body> {
        let mut st = self.lock();
        if let Some(code) = st.refuse_create.get(resource) {
            return status(
                *code,
                "Forbidden",
                &format!(
                    "{resource} is forbidden: User \"system:serviceaccount:{NS}:pgfleet-controller\" cannot create resource \"{resource}\""
                ),
            );
        }
        let name = obj["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if st
            .objects
            .contains_key(&(resource.to_string(), name.clone()))
        {
            return status(
                409,
                "AlreadyExists",
                &format!("{resource} \"{name}\" already exists"),
            );
        }
        st.version += 1;
        obj["metadata"]["uid"] = json!(format!("uid-{}-{}", resource, st.version));
        obj["metadata"]["resourceVersion"] = json!(st.version.to_string());
        obj["metadata"]["creationTimestamp"] = json!("2026-12-01T10:00:00Z");
        if resource == "pods" {
            obj["status"] = json!({"phase": "Pending"});
        }
        if resource == "pgfleetruns" {
            obj["metadata"]["generation"] = json!(1);
        }
        if matches!(resource, "pods" | "pgfleetruns") {
            broadcast(&mut st, resource, "ADDED", &obj);
        }
        st.objects.insert((resource.to_string(), name), obj.clone());
        json_response(201, &obj)
    }

    fn list(&self, resource: &str, q: &BTreeMap<String, String>) -> Response<Body> {
        let st = self.lock();
        let items: Vec<Value> = if resource == "events" {
            let want = q
                .get("fieldSelector")
                .and_then(|f| f.strip_prefix("involvedObject.name="))
                .unwrap_or_default();
            st.events
                .iter()
                .filter(|e| e["involvedObject"]["name"] == want)
                .cloned()
                .collect()
        } else {
            let selector = q.get("labelSelector").cloned().unwrap_or_default();
            st.objects
                .iter()
                .filter(|((r, _), o)| r == resource && matches(&selector, &o["metadata"]["labels"]))
                .map(|(_, o)| o.clone())
                .collect()
        };
        json_response(
            200,
            &json!({"apiVersion": "v1", "kind": "List",
                    "metadata": {"resourceVersion": st.version.to_string()}, "items": items}),
        )
    }

    /// Foreground deletion: the owner, then (the garbage collector) every
    /// object whose owner reference names its uid.
    fn delete(&self, resource: &str, name: &str, _opts: &Value) -> Response<Body> {
        let mut st = self.lock();
        let key = (resource.to_string(), name.to_string());
        // Finalizers hold an object: it is only marked for deletion.
        if let Some(obj) = st.objects.get_mut(&key)
            && obj["metadata"]["finalizers"]
                .as_array()
                .is_some_and(|f| !f.is_empty())
        {
            obj["metadata"]["deletionTimestamp"] = json!("2026-12-01T10:05:00Z");
            let v = st.version + 1;
            let obj = st.objects.get_mut(&key).unwrap();
            obj["metadata"]["resourceVersion"] = json!(v.to_string());
            let obj = obj.clone();
            st.version = v;
            broadcast(&mut st, resource, "MODIFIED", &obj);
            return json_response(200, &obj);
        }
        let Some(obj) = st.objects.remove(&key) else {
            return status(404, "NotFound", &format!("{resource} \"{name}\" not found"));
        };
        if resource == "pgfleetruns" {
            broadcast(&mut st, resource, "DELETED", &obj);
        }
        let uid = obj["metadata"]["uid"].clone();
        let owned: Vec<(String, String)> = st
            .objects
            .iter()
            .filter(|(_, o)| {
                o["metadata"]["ownerReferences"]
                    .as_array()
                    .is_some_and(|refs| refs.iter().any(|r| r["uid"] == uid))
            })
            .map(|(k, _)| k.clone())
            .collect();
        for k in owned {
            if let Some(o) = st.objects.remove(&k)
                && k.0 == "pods"
            {
                broadcast(&mut st, "pods", "DELETED", &o);
            }
        }
        json_response(200, &obj)
    }
}

/// A change, to the watches of its resource.
fn broadcast(st: &mut State, resource: &str, kind: &str, obj: &Value) {
    // A deletion is a change of its own, with a version of its own.
    let mut obj = obj.clone();
    if kind == "DELETED" {
        st.version += 1;
        obj["metadata"]["resourceVersion"] = json!(st.version.to_string());
    }
    let line = format!("{}\n", json!({"type": kind, "object": obj}));
    let v = obj["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or(st.version);
    st.history.push((v, resource.to_string(), line.clone()));
    st.watchers.retain(|(r, w)| {
        r != resource || w.send(Ok(Frame::data(Bytes::from(line.clone())))).is_ok()
    });
}

/// RFC 7386: objects merge key by key, null removes, the rest replaces.
fn merge(target: &mut Value, patch: &Value) {
    match patch.as_object() {
        Some(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            let t = target.as_object_mut().unwrap();
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        None => *target = patch.clone(),
    }
}

/// A request path's parts.
struct ApiPath {
    /// "" (core) or "pgfleet.io".
    group: String,
    resource: String,
    name: Option<String>,
    subresource: Option<String>,
}

fn api_path(path: &str) -> Option<ApiPath> {
    let (group, rest) = if let Some(r) = path.strip_prefix("/api/v1/namespaces/") {
        ("", r)
    } else if let Some(r) = path.strip_prefix("/apis/snapshot.storage.k8s.io/v1/namespaces/") {
        ("snapshot.storage.k8s.io", r)
    } else {
        (
            "pgfleet.io",
            path.strip_prefix("/apis/pgfleet.io/v1alpha1/namespaces/")?,
        )
    };
    let parts: Vec<&str> = rest.split('/').collect();
    if parts[0] != NS || parts.len() < 2 {
        return None;
    }
    Some(ApiPath {
        group: group.into(),
        resource: parts[1].into(),
        name: parts.get(2).map(|s| s.to_string()),
        subresource: parts.get(3).map(|s| s.to_string()),
    })
}

/// `a=b,c=d` label selectors (equality only, as the source writes them).
fn matches(selector: &str, labels: &Value) -> bool {
    selector
        .split(',')
        .filter(|s| !s.is_empty())
        .all(|kv| match kv.split_once('=') {
            Some((k, v)) => labels[k] == v,
            None => false,
        })
}

fn url_pairs(q: &str) -> BTreeMap<String, String> {
    q.split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), percent_decode(v)))
        .collect()
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let Ok(x) = u8::from_str_radix(&s[i + 1..i + 3], 16)
        {
            out.push(x);
            i += 3;
            continue;
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).to_string()
}

fn json_response(code: u16, v: &Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(v.to_string())).boxed())
        .unwrap()
}

fn status(code: u16, reason: &str, message: &str) -> Response<Body> {
    json_response(
        code,
        &json!({"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
                "message": message, "reason": reason, "code": code}),
    )
}

const SCENARIO: &str = r#"
name: k8s-test
fleet:
  - name: nvme
    count: 2
    instance: { type: m6id.4xlarge }
    storage: { profile: nvme, storage_class: local-nvme, size: 800GiB }
    kubernetes:
      requests: { cpu: 15, memory: 54GiB }
      node_selector: { pgfleet.io/pool: nvme }
      tolerations:
        - { key: pgfleet.io/benchmark, operator: Exists, effect: NoSchedule }
  - name: gp3
    count: 1
    instance: { type: m6id.4xlarge }
    storage: { profile: gp3, emulate: false, storage_class: gp3, size: 100GiB }
workloads:
  - kind: pgbench
    scale: 1
    duration_s: 5
"#;

fn scenario() -> scenario::Scenario {
    scenario::parse(Path::new("k8s-test.yaml"), SCENARIO).unwrap()
}

fn options() -> KubeOptions {
    KubeOptions {
        namespace: NS.into(),
        image: "registry.example/pgfleet-agent:0.1.0".into(),
        controller_url: "http://pgfleet-controller.bench.svc:7070".into(),
        pending_timeout: Duration::from_secs(600),
        exit_grace: Duration::from_secs(5),
        ..KubeOptions::default()
    }
}

async fn gone(rx: &mut mpsc::Receiver<Event>) -> (String, String) {
    loop {
        match tokio::time::timeout(Duration::from_secs(10), rx.recv()).await {
            Ok(Some(Event::Gone { agent_id, why })) => return (agent_id, why),
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the source's event channel closed"),
            Err(_) => panic!("no agent reported gone within 10 s"),
        }
    }
}

async fn until(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..200 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}");
}

/// A fake API server, and the test scenario's agents launched on it.
struct Launched {
    client: kube::Client,
    fake: FakeApi,
    agents: KubeAgents,
    ids: Vec<String>,
    rx: mpsc::Receiver<Event>,
}

async fn launch(opts: KubeOptions) -> Launched {
    let (client, fake) = FakeApi::start();
    let (tx, rx) = mpsc::channel(64);
    let agents = KubeAgents::launch(client.clone(), &scenario(), RUN, &opts, tx)
        .await
        .unwrap();
    let ids = agents
        .launched()
        .iter()
        .map(|l| l.agent_id.clone())
        .collect();
    Launched {
        client,
        fake,
        agents,
        ids,
        rx,
    }
}

const RUN: &str = "20261201-100000-abcdef";

#[tokio::test]
async fn launch_creates_an_owner_then_a_volume_and_a_pod_per_agent_and_the_end_deletes_them_by_propagation()
 {
    let Launched {
        fake,
        mut agents,
        ids,
        ..
    } = launch(options()).await;
    assert_eq!(
        ids,
        [
            "pgfleet-20261201-100000-abcdef-nvme-0",
            "pgfleet-20261201-100000-abcdef-nvme-1",
            "pgfleet-20261201-100000-abcdef-gp3-0"
        ]
    );
    let creates: Vec<Recorded> = fake
        .requests()
        .into_iter()
        .filter(|r| r.method == "POST")
        .collect();
    let order: Vec<String> = creates
        .iter()
        .map(|r| {
            format!(
                "{} {}",
                r.path.rsplit('/').next().unwrap(),
                r.body["metadata"]["name"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(
        order,
        [
            "configmaps pgfleet-run-20261201-100000-abcdef",
            "persistentvolumeclaims pgfleet-20261201-100000-abcdef-nvme-0-data",
            "pods pgfleet-20261201-100000-abcdef-nvme-0",
            "persistentvolumeclaims pgfleet-20261201-100000-abcdef-nvme-1-data",
            "pods pgfleet-20261201-100000-abcdef-nvme-1",
            "persistentvolumeclaims pgfleet-20261201-100000-abcdef-gp3-0-data",
            "pods pgfleet-20261201-100000-abcdef-gp3-0",
        ],
        "the owner first, then each agent's volume before its pod"
    );
    let owner = fake
        .object("configmaps", "pgfleet-run-20261201-100000-abcdef")
        .unwrap();
    let owner_uid = owner["metadata"]["uid"].as_str().unwrap().to_string();
    assert_eq!(owner["metadata"]["labels"]["pgfleet.io/run"], RUN);
    assert_eq!(
        owner["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "pgfleet"
    );

    for r in &creates[1..] {
        let m = &r.body["metadata"];
        let refs = m["ownerReferences"].as_array().unwrap();
        assert_eq!(refs.len(), 1, "{}", r.body);
        assert_eq!(
            refs[0]["uid"],
            owner_uid.as_str(),
            "owned by the run's ConfigMap"
        );
        assert_eq!(refs[0]["kind"], "ConfigMap");
        assert_eq!(refs[0]["controller"], true);
        assert_eq!(refs[0]["blockOwnerDeletion"], true);
        assert_eq!(m["labels"]["pgfleet.io/run"], RUN);
        assert_eq!(m["labels"]["app.kubernetes.io/part-of"], "pgfleet");
        assert_eq!(m["labels"]["app.kubernetes.io/managed-by"], "pgfleet");
    }
    // The volume: the class's storage class and size.
    let pvc = &creates[1].body;
    assert_eq!(pvc["spec"]["storageClassName"], "local-nvme");
    assert_eq!(pvc["spec"]["resources"]["requests"]["storage"], "800Gi");
    assert_eq!(pvc["spec"]["accessModes"], json!(["ReadWriteOnce"]));
    assert_eq!(pvc["metadata"]["labels"]["pgfleet.io/class"], "nvme");
    assert_eq!(creates[5].body["spec"]["storageClassName"], "gp3");
    assert_eq!(
        creates[5].body["spec"]["resources"]["requests"]["storage"],
        "100Gi"
    );

    // The pod: on the instance type's node pool, alone on its node.
    let pod = &creates[2].body;
    let spec = &pod["spec"];
    assert_eq!(pod["metadata"]["labels"]["pgfleet.io/class"], "nvme");
    assert_eq!(
        pod["metadata"]["labels"]["app.kubernetes.io/name"],
        "pgfleet-agent"
    );
    assert_eq!(
        spec["nodeSelector"]["node.kubernetes.io/instance-type"],
        "m6id.4xlarge"
    );
    assert_eq!(spec["nodeSelector"]["pgfleet.io/pool"], "nvme");
    let anti =
        &spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0];
    assert_eq!(anti["topologyKey"], "kubernetes.io/hostname");
    assert_eq!(
        anti["labelSelector"]["matchLabels"]["app.kubernetes.io/name"],
        "pgfleet-agent"
    );
    assert_eq!(
        spec["tolerations"],
        json!([{"key": "pgfleet.io/benchmark", "operator": "Exists", "effect": "NoSchedule"}])
    );
    assert_eq!(spec["restartPolicy"], "Never");
    let c = &spec["containers"][0];
    assert_eq!(c["image"], "registry.example/pgfleet-agent:0.1.0");
    assert_eq!(
        c["args"],
        json!(["--give-up-after-s", "600", "--metrics-addr", "0.0.0.0:9187"]),
        "outlives a controller restart; serves its own metrics"
    );
    // The PodMonitor in deploy/monitoring scrapes the `metrics` port and
    // takes the pod's labels as target labels.
    assert_eq!(
        c["ports"],
        json!([{"name": "metrics", "containerPort": 9187, "protocol": "TCP"}])
    );
    let monitor = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/monitoring/podmonitor.yaml"),
    )
    .unwrap();
    assert!(monitor.contains("port: metrics"));
    for label in pod["metadata"]["labels"].as_object().unwrap().keys() {
        let meta = format!(
            "__meta_kubernetes_pod_label_{}",
            label.replace(['.', '/', '-'], "_")
        );
        if label.starts_with("pgfleet.io/") {
            assert!(monitor.contains(&meta), "the PodMonitor misses {meta}");
        }
    }
    assert_eq!(
        pod["metadata"]["labels"]["pgfleet.io/storage-profile"],
        "nvme"
    );
    assert_eq!(
        c["resources"]["requests"],
        json!({"cpu": "15", "memory": "54Gi"})
    );
    let env: BTreeMap<String, Value> = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["name"].as_str().unwrap().to_string(), e.clone()))
        .collect();
    assert_eq!(
        env["PGFLEET_CONTROLLER"]["value"],
        "http://pgfleet-controller.bench.svc:7070"
    );
    assert_eq!(
        env["PGFLEET_AGENT_ID"]["value"],
        "pgfleet-20261201-100000-abcdef-nvme-0"
    );
    assert_eq!(env["PGFLEET_INSTANCE_CLASS"]["value"], "nvme");
    assert_eq!(env["PGFLEET_DATA_ROOT"]["value"], "/data");
    assert_eq!(
        env["PGFLEET_ADVERTISE_ADDRESS"]["valueFrom"]["fieldRef"]["fieldPath"], "status.podIP",
        "the pod IP is the advertised address"
    );
    // The join token comes as a Secret's key in the environment (the agent
    // reads it once and removes it), never as a file PostgreSQL, of the
    // same uid in the pod, could read.
    assert_eq!(
        env["PGFLEET_JOIN_TOKEN"]["valueFrom"]["secretKeyRef"],
        json!({"name": "pgfleet-tokens", "key": "join-token"})
    );
    assert!(!env.contains_key("PGFLEET_TOKEN_FILE"), "{env:?}");
    let volumes = spec["volumes"].as_array().unwrap();
    let data = volumes.iter().find(|v| v["name"] == "data").unwrap();
    assert_eq!(
        data["persistentVolumeClaim"]["claimName"], "pgfleet-20261201-100000-abcdef-nvme-0-data",
        "the volume is the data root"
    );
    assert!(
        volumes
            .iter()
            .all(|v| v["secret"]["secretName"] != "pgfleet-tokens"),
        "no volume of the join token: {volumes:?}"
    );
    // The gp3 class has no node selector beyond its instance type.
    assert_eq!(
        creates[6].body["spec"]["nodeSelector"],
        json!({"node.kubernetes.io/instance-type": "m6id.4xlarge"})
    );

    // The agents run, then exit after the controller's shutdown.
    for id in &ids {
        fake.update_pod(id, |p| {
            p["status"] = json!({"phase": "Running", "podIP": "10.0.0.7"})
        });
    }
    for id in &ids {
        fake.update_pod(id, |p| p["status"]["phase"] = json!("Succeeded"));
    }
    let t = std::time::Instant::now();
    agents.shutdown().await;
    assert!(
        t.elapsed() < Duration::from_secs(4),
        "pods that ended need no wait: {:?}",
        t.elapsed()
    );
    let delete = fake
        .requests()
        .into_iter()
        .find(|r| r.method == "DELETE")
        .expect("the end deletes the run's owner");
    assert_eq!(
        delete.path,
        format!("/api/v1/namespaces/{NS}/configmaps/pgfleet-run-{RUN}")
    );
    assert_eq!(
        delete.body["propagationPolicy"], "Foreground",
        "{}",
        delete.body
    );
    assert!(fake.names("pods").is_empty(), "{:?}", fake.names("pods"));
    assert!(fake.names("persistentvolumeclaims").is_empty());
    assert!(fake.names("configmaps").is_empty());
}

#[tokio::test]
async fn a_failed_evicted_or_deleted_pod_loses_its_agent_at_once() {
    let Launched {
        fake,
        mut agents,
        ids,
        mut rx,
        ..
    } = launch(options()).await;
    for id in &ids {
        fake.update_pod(id, |p| p["status"] = json!({"phase": "Running"}));
    }
    // Evicted by the kubelet (node pressure): phase Failed, reason Evicted.
    fake.update_pod(&ids[0], |p| {
        p["status"] = json!({"phase": "Failed", "reason": "Evicted",
            "message": "The node was low on resource: ephemeral-storage."})
    });
    let (id, why) = gone(&mut rx).await;
    assert_eq!(id, ids[0]);
    assert!(
        why.contains("Evicted") && why.contains("low on resource"),
        "{why}"
    );
    // The agent crashed: its container ended with an error.
    fake.update_pod(&ids[1], |p| {
        p["status"] = json!({"phase": "Failed", "containerStatuses": [{
            "name": "agent", "ready": false, "restartCount": 0, "image": "x", "imageID": "",
            "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]})
    });
    let (id, why) = gone(&mut rx).await;
    assert_eq!(id, ids[1]);
    assert!(why.contains("OOMKilled") && why.contains("137"), "{why}");
    // Deleted (kubectl delete pod, a drain): gone at once.
    fake.delete_pod(&ids[2]);
    let (id, why) = gone(&mut rx).await;
    assert_eq!(id, ids[2]);
    assert!(why.contains("deleted"), "{why}");
    // Each once.
    fake.update_pod(&ids[0], |p| {
        p["metadata"]["labels"]["touched"] = json!("yes")
    });
    assert!(
        tokio::time::timeout(Duration::from_millis(500), rx.recv())
            .await
            .is_err(),
        "an agent is reported gone once"
    );
    agents.shutdown().await;
    assert!(fake.names("pods").is_empty());
}

#[tokio::test]
async fn a_pod_pending_past_the_timeout_is_given_up_with_the_reason_from_its_conditions_and_events()
{
    let opts = KubeOptions {
        pending_timeout: Duration::from_secs(2),
        ..options()
    };
    let Launched {
        fake,
        mut agents,
        ids,
        mut rx,
        ..
    } = launch(opts).await;
    // nvme-0: no node of the pool; nvme-1: its image cannot be pulled;
    // gp3-0: runs (not given up).
    fake.update_pod(&ids[0], |p| {
        p["status"] = json!({"phase": "Pending", "conditions": [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector."}]})
    });
    fake.add_event(
        &ids[0],
        "FailedScheduling",
        "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector.",
    );
    fake.update_pod(&ids[1], |p| {
        p["status"] = json!({"phase": "Pending", "containerStatuses": [{
            "name": "agent", "ready": false, "restartCount": 0, "image": "x", "imageID": "",
            "state": {"waiting": {"reason": "ImagePullBackOff",
                "message": "Back-off pulling image \"registry.example/pgfleet-agent:0.1.0\""}}}]})
    });
    fake.update_pod(&ids[2], |p| p["status"] = json!({"phase": "Running"}));
    let mut reasons = BTreeMap::new();
    for _ in 0..2 {
        let (id, why) = gone(&mut rx).await;
        reasons.insert(id, why);
    }
    let a = &reasons[&ids[0]];
    assert!(a.contains("still Pending after 2s"), "{a}");
    assert!(
        a.contains("Unschedulable") && a.contains("didn't match Pod's node affinity/selector"),
        "{a}"
    );
    assert!(a.contains("event FailedScheduling"), "{a}");
    let b = &reasons[&ids[1]];
    assert!(
        b.contains("ImagePullBackOff") && b.contains("Back-off pulling image"),
        "{b}"
    );
    assert!(
        tokio::time::timeout(Duration::from_secs(3), rx.recv())
            .await
            .is_err(),
        "a running pod is not given up"
    );
    agents.shutdown().await;
}

#[tokio::test]
async fn a_refused_create_deletes_what_was_made_and_says_which_permission() {
    let (client, fake) = FakeApi::start();
    fake.lock().refuse_create.insert("pods".into(), 403);
    let (tx, _rx) = mpsc::channel(64);
    let err = match KubeAgents::launch(client, &scenario(), RUN, &options(), tx).await {
        Ok(_) => panic!("a refused pod must fail the launch"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("creating Pod") && err.contains("role.yaml"),
        "{err}"
    );
    assert!(fake.names("configmaps").is_empty(), "the owner is deleted");
    assert!(
        fake.names("persistentvolumeclaims").is_empty(),
        "and the volume with it"
    );
}

#[tokio::test]
async fn reap_deletes_the_objects_of_runs_that_are_not_running() {
    let (client, fake) = FakeApi::start();
    for (run, status) in [
        ("run-a", "running"),
        ("run-b", "succeeded"),
        ("run-c", "gone"),
    ] {
        let owner = format!("pgfleet-run-{run}");
        fake.put(
            "configmaps",
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": owner, "namespace": NS,
                "labels": {"app.kubernetes.io/managed-by": "pgfleet", "app.kubernetes.io/component": "run",
                           "pgfleet.io/run": run, "status-in-test": status}}}),
        );
        let uid = fake.object("configmaps", &owner).unwrap()["metadata"]["uid"].clone();
        fake.put(
            "pods",
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": format!("pgfleet-{run}-x-0"), "namespace": NS,
                "labels": {"pgfleet.io/run": run},
                "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": owner, "uid": uid}]}}),
        );
    }
    // Not pgfleet's: left alone.
    fake.put(
        "configmaps",
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "someone-else", "namespace": NS}}),
    );
    let reaped = kubernetes::reap(&client, NS, |run| run == "run-a")
        .await
        .unwrap();
    assert_eq!(reaped, ["run-b", "run-c"]);
    assert_eq!(
        fake.names("configmaps"),
        ["pgfleet-run-run-a", "someone-else"]
    );
    assert_eq!(fake.names("pods"), ["pgfleet-run-a-x-0"]);
    let list = fake
        .requests()
        .into_iter()
        .find(|r| r.method == "GET")
        .unwrap();
    assert!(
        url_pairs(&list.query)["labelSelector"].contains("app.kubernetes.io/managed-by=pgfleet"),
        "{}",
        list.query
    );
}

/// A run whose pods never leave Pending ends, failed, with the reason, and
/// leaves nothing behind: the real scheduler, store and gRPC service.
#[tokio::test]
async fn the_run_fails_with_the_reason_when_its_pods_stay_pending() {
    use pgfleet_controller::runner::{RunAgents, RunSpec, Runner};
    use pgfleet_controller::store::{NewRun, Owner, RunStatus};
    let s = Scratch::new("k8s-pending");
    let (client, fake) = FakeApi::start();
    let cfg = service_config(&s, true);
    std::fs::create_dir_all(s.store().parent().unwrap()).unwrap();
    let mut service = Runner::build(&cfg).unwrap();
    service.listen().await.unwrap();
    let sc = scenario();
    let cells = scenario::plan(&sc);
    let run_id = "20261201-120000-000001";
    service
        .store
        .create_run(&NewRun {
            id: run_id,
            name: "k8s-test",
            path: "k8s-test.yaml",
            yaml: SCENARIO,
            owner: Owner::Serve,
            idempotency_key: None,
            labels: &Default::default(),
            cells: &cells,
            estimated_seconds: scenario::plan::estimate(&sc, &cells).wall_seconds,
        })
        .unwrap();
    service.store.start_run(run_id).unwrap();
    let opts = KubeOptions {
        pending_timeout: Duration::from_secs(2),
        ..options()
    };
    let f = fake.clone();
    let kubelet = tokio::spawn(async move {
        // The scheduler finds no node: every pod stays Pending.
        until("the pods", || f.names("pods").len() == 3).await;
        for name in f.names("pods") {
            f.update_pod(&name, |p| {
                p["status"] = json!({"phase": "Pending", "conditions": [{
                    "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                    "message": "0/2 nodes are available: 2 Insufficient cpu."}]})
            });
        }
    });
    let spec = RunSpec {
        run_id,
        scenario: &sc,
        cells,
        estimated_wall: 10.0,
    };
    let status = tokio::time::timeout(
        Duration::from_secs(60),
        service.execute(
            spec,
            RunAgents::Kubernetes {
                client: &client,
                opts: &opts,
            },
            tokio_util::sync::CancellationToken::new(),
            None,
        ),
    )
    .await
    .expect("the run ends well before its registration timeout")
    .unwrap();
    kubelet.await.unwrap();
    assert_eq!(status, RunStatus::Failed);
    let cells = service.store.cells(run_id).unwrap();
    assert!(!cells.is_empty());
    for c in &cells {
        assert_eq!(c.state, "failed", "{c:?}");
        let e = c.error.clone().unwrap_or_default();
        assert!(
            e.contains("still Pending") && e.contains("Insufficient cpu"),
            "{e}"
        );
    }
    assert!(fake.names("pods").is_empty(), "the run's pods are deleted");
    assert!(fake.names("persistentvolumeclaims").is_empty());
    assert!(fake.names("configmaps").is_empty());
    service.shutdown().await;
}

/// Every request the source makes on every path is allowed by deploy/'s
/// Role, and the Role grants nothing the source does not use.
#[tokio::test]
async fn every_request_is_allowed_by_the_role_and_the_role_grants_no_more() {
    // Launch, watch, a failure, a Pending pod, the end, and a reap.
    let Launched {
        client,
        fake,
        mut agents,
        ids,
        mut rx,
    } = launch(KubeOptions {
        pending_timeout: Duration::from_secs(1),
        ..options()
    })
    .await;
    fake.update_pod(&ids[0], |p| p["status"] = json!({"phase": "Failed"}));
    fake.update_pod(&ids[2], |p| p["status"] = json!({"phase": "Running"}));
    gone(&mut rx).await;
    gone(&mut rx).await;
    agents.shutdown().await;
    fake.put(
        "configmaps",
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "pgfleet-run-old", "namespace": NS,
            "labels": {"app.kubernetes.io/managed-by": "pgfleet", "app.kubernetes.io/component": "run", "pgfleet.io/run": "old"}}}),
    );
    kubernetes::reap(&client, NS, |_| false).await.unwrap();
    // A failed run kept by `cleanup: {on_failure: keep}`.
    let keep = format!("{SCENARIO}cleanup: {{ on_failure: keep }}\n");
    let sc = scenario::parse(Path::new("keep.yaml"), &keep).unwrap();
    let (tx, _rx2) = mpsc::channel(64);
    let mut kept = KubeAgents::launch(
        client.clone(),
        &sc,
        "20261201-100001-keep00",
        &options(),
        tx,
    )
    .await
    .unwrap();
    assert!(
        kept.end(RunEnd {
            succeeded: false,
            ..Default::default()
        })
        .await
        .is_some()
    );

    let mut used = rbac_uses(&fake.requests());
    // Datasets kept as snapshots, and volumes made from them.
    used.extend(rbac_uses(&snapshot_flow().await));
    // The PgfleetRuns' reconciler: a resource accepted, rejected, deleted.
    let op = Operator::start(&Scratch::new("k8s-rbac")).await;
    op.fake.put(
        "pgfleetruns",
        pgfleetrun(
            "bad",
            json!({"fleet": [{"name": "a"}],
        "workloads": [{"kind": "pgbench", "scale": 0}]}),
        ),
    );
    op.until_phase("bad", "Rejected").await;
    op.delete("bad").await;
    used.extend(rbac_uses(&op.fake.requests()));
    op.stop().await;
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let text = std::fs::read_to_string(repo.join("deploy/base/rbac.yaml")).unwrap();
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
    let role = docs
        .iter()
        .find(|d| d["kind"] == "Role")
        .expect("a Role in deploy/base/rbac.yaml");
    let mut granted = std::collections::BTreeSet::new();
    for rule in role["rules"].as_array().unwrap() {
        let group = rule["apiGroups"][0].as_str().unwrap().to_string();
        assert!(
            rule["apiGroups"].as_array().unwrap().len() == 1
                && (group.is_empty()
                    || group == "pgfleet.io"
                    || group == "snapshot.storage.k8s.io"),
            "core resources, snapshots and pgfleet's own only: {rule}"
        );
        for res in rule["resources"].as_array().unwrap() {
            for verb in rule["verbs"].as_array().unwrap() {
                granted.insert((
                    group.clone(),
                    res.as_str().unwrap().to_string(),
                    verb.as_str().unwrap().to_string(),
                ));
            }
        }
    }
    let denied: Vec<_> = used.difference(&granted).collect();
    assert!(
        denied.is_empty(),
        "requests the Role does not allow: {denied:?}"
    );
    let unused: Vec<_> = granted.difference(&used).collect();
    assert!(
        unused.is_empty(),
        "the Role grants what the source never uses: {unused:?}"
    );
}

/// (API group, resource[/subresource], verb) of each request, as RBAC
/// names them.
fn rbac_uses(requests: &[Recorded]) -> std::collections::BTreeSet<(String, String, String)> {
    requests
        .iter()
        .map(|r| {
            let p = api_path(&r.path).unwrap_or_else(|| panic!("no route {}", r.path));
            let verb = match (r.method.as_str(), p.name.is_some()) {
                ("POST", _) => "create",
                ("GET", false)
                    if url_pairs(&r.query)
                        .get("watch")
                        .is_some_and(|w| w == "true") =>
                {
                    "watch"
                }
                ("GET", false) => "list",
                ("GET", true) => "get",
                ("DELETE", _) => "delete",
                ("PATCH", _) => "patch",
                ("PUT", _) => "update",
                (m, _) => panic!("unexpected method {m}"),
            };
            let resource = match p.subresource {
                Some(sub) => format!("{}/{sub}", p.resource),
                None => p.resource,
            };
            (p.group, resource, verb.to_string())
        })
        .collect()
}

fn kubernetes_validate() -> std::path::PathBuf {
    let venv = Path::new("/opt/pgfleet-venv/bin/kubernetes-validate");
    assert!(
        venv.exists(),
        "{} missing: .ci/run installs it (pip install kubernetes-validate)",
        venv.display()
    );
    venv.to_path_buf()
}

fn validate_objects(yaml: &str, what: &str) {
    use std::io::Write;
    let mut child = Command::new(kubernetes_validate())
        .args(["--strict", "--quiet", "-k", KUBE_VERSION, "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(yaml.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{what} is not valid Kubernetes {KUBE_VERSION}: {}",
        show(&out)
    );
}

/// `kubectl kustomize` of every overlay is valid Kubernetes (strict), and
/// names the images deploy/images builds.
#[test]
fn every_overlay_renders_to_valid_objects_that_name_the_images_deploy_builds() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let s = Scratch::new("kustomize");
    // A copy of deploy/ with the tokens file the user makes.
    let deploy = s.dir.join("deploy");
    let cp = Command::new("cp")
        .arg("-r")
        .arg(repo.join("deploy"))
        .arg(&s.dir)
        .output()
        .unwrap();
    assert!(cp.status.success(), "{}", show(&cp));
    let _ = std::fs::remove_file(deploy.join("base/tokens.env"));
    std::fs::copy(
        deploy.join("base/tokens.env.example"),
        deploy.join("base/tokens.env"),
    )
    .unwrap();
    let build = std::fs::read_to_string(repo.join("deploy/images/build.sh")).unwrap();
    for overlay in ["eks", "local"] {
        let out = Command::new("kubectl")
            .arg("kustomize")
            .arg(deploy.join("overlays").join(overlay))
            .output()
            .expect("kubectl (for `kubectl kustomize`) is installed");
        assert!(out.status.success(), "kustomize {overlay}: {}", show(&out));
        let yaml = String::from_utf8(out.stdout).unwrap();
        let docs: Vec<Value> = serde_saphyr::from_multiple(&yaml).unwrap();
        // The snapshot controller's kinds are CRDs the schemas do not have:
        // checked below by hand, the rest by kubernetes-validate.
        let (snapshot_classes, core): (Vec<Value>, Vec<Value>) = docs
            .iter()
            .cloned()
            .partition(|d| d["kind"] == "VolumeSnapshotClass");
        let core_yaml = core
            .iter()
            .map(|d| serde_json::to_string(d).unwrap())
            .collect::<Vec<_>>()
            .join("\n---\n");
        validate_objects(&core_yaml, &format!("overlays/{overlay}"));
        let kinds: Vec<String> = docs
            .iter()
            .map(|d| d["kind"].as_str().unwrap().to_string())
            .collect();
        for k in [
            "Namespace",
            "ServiceAccount",
            "Role",
            "RoleBinding",
            "Secret",
            "Deployment",
            "Service",
            "PersistentVolumeClaim",
        ] {
            assert!(
                kinds.iter().any(|x| x == k),
                "{overlay} lacks a {k}: {kinds:?}"
            );
        }
        let deploy_obj = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
        assert_eq!(deploy_obj["spec"]["strategy"]["type"], "Recreate");
        let c = &deploy_obj["spec"]["template"]["spec"]["containers"][0];
        let args: Vec<String> = c["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_string())
            .collect();
        let agent_image = args
            .iter()
            .find_map(|a| a.strip_prefix("--agent-image="))
            .unwrap_or_else(|| panic!("{overlay}: no --agent-image in {args:?}"));
        assert!(
            args.contains(&"--agents=kubernetes".to_string()),
            "{args:?}"
        );
        for (image, repo_name) in [
            (c["image"].as_str().unwrap(), "pgfleet-controller"),
            (agent_image, "pgfleet-agent"),
        ] {
            let name = image.rsplit('/').next().unwrap().split(':').next().unwrap();
            assert_eq!(name, repo_name, "{overlay}: {image}");
            assert!(
                build.contains(&format!("-t \"{repo_name}:$tag\"")),
                "deploy/images/build.sh does not build {repo_name}"
            );
        }
        // Every namespaced object in the namespace the controller creates
        // runs in.
        for d in &docs {
            if !matches!(
                d["kind"].as_str(),
                Some(
                    "Namespace"
                        | "StorageClass"
                        | "CustomResourceDefinition"
                        | "VolumeSnapshotClass"
                )
            ) {
                assert_eq!(d["metadata"]["namespace"], "pgfleet", "{}", d["metadata"]);
            }
        }
        if overlay == "eks" {
            let classes: BTreeMap<String, Value> = docs
                .iter()
                .filter(|d| d["kind"] == "StorageClass")
                .map(|d| {
                    (
                        d["metadata"]["name"].as_str().unwrap().to_string(),
                        d.clone(),
                    )
                })
                .collect();
            assert_eq!(classes["gp3"]["parameters"]["iops"], "3000");
            assert_eq!(classes["gp3"]["parameters"]["throughput"], "125");
            assert_eq!(
                classes["local-nvme"]["volumeBindingMode"],
                "WaitForFirstConsumer"
            );
            // --dataset-snapshots maps gp3 to a VolumeSnapshotClass of the
            // overlay whose driver is gp3's provisioner.
            let mapping = args
                .iter()
                .find_map(|a| a.strip_prefix("--dataset-snapshots="))
                .expect("eks keeps datasets as snapshots");
            let (sc, class) = mapping.split_once('=').unwrap();
            let vsc = snapshot_classes
                .iter()
                .find(|d| d["metadata"]["name"] == class)
                .unwrap_or_else(|| panic!("no VolumeSnapshotClass {class}"));
            assert_eq!(vsc["apiVersion"], "snapshot.storage.k8s.io/v1");
            assert_eq!(vsc["driver"], classes[sc]["provisioner"], "{vsc}");
            assert!(matches!(
                vsc["deletionPolicy"].as_str(),
                Some("Delete" | "Retain")
            ));
            let known: BTreeSet<&str> = [
                "apiVersion",
                "kind",
                "metadata",
                "driver",
                "deletionPolicy",
                "parameters",
            ]
            .into();
            for k in vsc.as_object().unwrap().keys() {
                assert!(
                    known.contains(k.as_str()),
                    "VolumeSnapshotClass v1 has no `{k}`"
                );
            }
            // The at-scale scenario's storage classes exist in this overlay.
            let sc = scenario::load(&repo.join("scenarios/at-scale/nvme-vs-ebs.yaml")).unwrap();
            for f in &sc.fleet.value {
                let class = &f
                    .storage
                    .as_ref()
                    .unwrap()
                    .storage_class
                    .as_ref()
                    .unwrap()
                    .value;
                assert!(
                    classes.contains_key(class),
                    "no StorageClass {class} in overlays/eks"
                );
            }
        }
    }
    // The controller's uid is the one its image runs as.
    let dockerfile =
        std::fs::read_to_string(repo.join("deploy/images/controller.Dockerfile")).unwrap();
    let base = std::fs::read_to_string(repo.join("deploy/base/controller.yaml")).unwrap();
    assert!(dockerfile.contains("--uid 10002") && base.contains("runAsUser: 10002"));
    let agent = std::fs::read_to_string(repo.join("deploy/images/agent.Dockerfile")).unwrap();
    assert!(agent.contains("usermod -u 10001") && kubernetes::AGENT_UID == 10001);
}

/// The seeds' Experiment 1 as a dry run: 8 agents on two node pools, each
/// with a volume of its storage class; valid objects.
#[test]
fn the_at_scale_scenario_plans_eight_agents_on_two_node_pools() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let out = Command::new(pgfleet())
        .args(["validate", "--kubernetes", "--namespace", "pgfleet"])
        .arg(repo.join("scenarios/at-scale/nvme-vs-ebs.yaml"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", show(&out));
    let yaml = String::from_utf8(out.stdout.clone()).unwrap();
    let summary = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(summary.contains("8 agents on 2 node pools"), "{summary}");
    // What it takes there: the pods' datasets would be on their own
    // volumes, gone with the run, and each agent runs one cell: a build
    // would publish a copy for nobody, so every cell loads its own.
    assert!(
        summary.contains("valid; ")
            && summary.contains("8 cell(s) of m6id-4xlarge-gp3, m6id-4xlarge-nvme load their own data: they would build a copy no cell restores"),
        "{summary}"
    );
    validate_objects(&yaml, "the dry run");
    let docs: Vec<Value> = serde_saphyr::from_multiple(&yaml).unwrap();
    // `kubectl apply --dry-run=server` refuses an owner reference without
    // a uid, and the owner has none before it exists: none are shown.
    assert!(
        docs.iter()
            .all(|d| d["metadata"]["ownerReferences"].is_null()),
        "{yaml}"
    );
    assert_eq!(
        yaml.matches("# pgfleet sets ownerReferences to ConfigMap")
            .count(),
        16,
        "a note on each volume and pod"
    );
    let pods: Vec<&Value> = docs.iter().filter(|d| d["kind"] == "Pod").collect();
    let pvcs: Vec<&Value> = docs
        .iter()
        .filter(|d| d["kind"] == "PersistentVolumeClaim")
        .collect();
    assert_eq!((pods.len(), pvcs.len()), (8, 8));
    let mut pools = BTreeMap::new();
    for p in &pods {
        assert_eq!(
            p["spec"]["nodeSelector"]["node.kubernetes.io/instance-type"],
            "m6id.4xlarge"
        );
        *pools
            .entry(
                p["spec"]["nodeSelector"]["pgfleet.io/pool"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            )
            .or_insert(0) += 1;
    }
    assert_eq!(
        pools,
        BTreeMap::from([("gp3".to_string(), 4), ("nvme".to_string(), 4)])
    );
    let mut classes = BTreeMap::new();
    for v in &pvcs {
        assert_eq!(v["spec"]["resources"]["requests"]["storage"], "800Gi");
        *classes
            .entry(v["spec"]["storageClassName"].as_str().unwrap().to_string())
            .or_insert(0) += 1;
    }
    assert_eq!(
        classes,
        BTreeMap::from([("gp3".to_string(), 4), ("local-nvme".to_string(), 4)])
    );
}

/// Every scenario of scenarios/at-scale/ is for a Kubernetes fleet: each
/// of its pods goes to a node of its instance type and pool, and each
/// volume names its storage class and a size for ~500 GB of data (the
/// storage suite once had none: 10 GiB volumes of the default class on
/// any node).
#[test]
fn every_at_scale_scenario_pins_its_pods_to_node_pools() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .join("scenarios/at-scale");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 4, "{files:?}");
    for f in &files {
        let out = Command::new(pgfleet())
            .args(["validate", "--kubernetes"])
            .arg(f)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}: {}", f.display(), show(&out));
        let yaml = String::from_utf8(out.stdout).unwrap();
        let docs: Vec<Value> = serde_saphyr::from_multiple(&yaml).unwrap();
        for d in &docs {
            let at = format!("{}: {}", f.display(), d["metadata"]["name"]);
            if d["kind"] == "Pod" {
                let sel = &d["spec"]["nodeSelector"];
                // The seeds' m6id.4xlarge; PostgresBench's 4-vCPU m6id.xlarge.
                assert!(
                    ["m6id.4xlarge", "m6id.xlarge"].contains(
                        &sel["node.kubernetes.io/instance-type"]
                            .as_str()
                            .unwrap_or("")
                    ),
                    "{at}"
                );
                assert!(sel["pgfleet.io/pool"].is_string(), "{at}");
            }
            if d["kind"] == "PersistentVolumeClaim" {
                assert!(d["spec"]["storageClassName"].is_string(), "{at}");
                let size = d["spec"]["resources"]["requests"]["storage"]
                    .as_str()
                    .unwrap();
                let bytes = kubernetes::parse_quantity(size).unwrap();
                assert!(bytes >= 200 << 30, "{at}: {size}");
            }
        }
    }
}

/// Kubernetes keys are validated like the rest, with file:line errors; a
/// class that asks pods to emulate storage caps is refused for Kubernetes.
#[test]
fn kubernetes_keys_get_located_errors() {
    let s = Scratch::new("k8s-keys");
    let cases = [
        (
            "    kubernetes: { tolerations: [ { key: a, operator: Sometimes } ] }\n",
            5,
            "toleration operator",
        ),
        (
            "    storage: { profile: nvme, storage_class: Fast_SSD }\n",
            5,
            "StorageClass name",
        ),
        (
            "    storage: { profile: nvme, size: 10MiB }\n",
            5,
            "at least 1GiB",
        ),
        (
            "    kubernetes: { requests: { cpu: 0 } }\n",
            5,
            "0.001..=1024",
        ),
        (
            "    kubernetes: { node_selector: { \"bad key!\": x } }\n",
            5,
            "not a node label key",
        ),
    ];
    for (line, at, want) in cases {
        let text = format!(
            "name: t\nfleet:\n  - name: a\n    count: 1\n{line}workloads:\n  - kind: pgbench\n    scale: 1\n"
        );
        let p = s.write("t.yaml", &text);
        let out = Command::new(pgfleet())
            .arg("validate")
            .arg(&p)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{line}: {}", show(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("t.yaml:{at}:")) && err.contains(want),
            "{line}: {err}"
        );
    }
    // Valid in general, refused as pods: gp3's caps would be emulated.
    let p = s.write(
        "gp3.yaml",
        "name: t\nfleet:\n  - name: a\n    storage: { profile: gp3 }\nworkloads:\n  - kind: pgbench\n    scale: 1\n",
    );
    let out = Command::new(pgfleet())
        .arg("validate")
        .arg(&p)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", show(&out));
    let out = Command::new(pgfleet())
        .args(["validate", "--kubernetes"])
        .arg(&p)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", show(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("gp3.yaml:4:") && err.contains("emulate: false"),
        "{err}"
    );
}

// ------------------------------------------------------------ PgfleetRuns
//
// The reconciler of `serve --agents kubernetes` over PgfleetRuns, on the
// fake API server (the one fake these tests accept: no API server can run
// here). The runs themselves are real: a controller with local agents runs
// them on real PostgreSQL clusters, as `pgfleet run` does. That the run's
// pods and volumes go when a run ends or is cancelled is the Kubernetes
// source's part, tested above.

use pgfleet_controller::queue::RunQueue;
use pgfleet_controller::resource;
use tokio_util::sync::CancellationToken;

/// The agents' endpoint of an in-process controller on `s`'s store.
fn service_config(s: &Scratch, pool: bool) -> pgfleet_controller::runner::RunnerConfig {
    pgfleet_controller::runner::RunnerConfig {
        store: s.store(),
        bind: "127.0.0.1:0".parse().unwrap(),
        advertise_url: None,
        lease: Duration::from_secs(10),
        registration_timeout: Duration::from_secs(120),
        tls_cert: None,
        tls_key: None,
        tls_ca: None,
        join_token_file: None,
        pool,
        interactive: false,
    }
}

/// A PgfleetRun as `kubectl apply` would create it.
fn pgfleetrun(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "pgfleet.io/v1alpha1", "kind": "PgfleetRun",
           "metadata": {"name": name, "namespace": NS, "generation": 1,
                        "creationTimestamp": "2026-12-01T10:00:00Z"},
           "spec": spec})
}

/// A controller with local agents, and the reconciler on a fake API.
struct Operator {
    fake: FakeApi,
    client: kube::Client,
    served: Arc<RunQueue>,
    stop: CancellationToken,
    drive: tokio::task::JoinHandle<()>,
    reconciler: Option<(CancellationToken, tokio::task::JoinHandle<()>)>,
}

impl Operator {
    /// Runs on local agents (real PostgreSQL).
    async fn start(s: &Scratch) -> Operator {
        use pgfleet_controller::agents::local::LocalOptions;
        use pgfleet_controller::controller::AgentSupply;
        Operator::start_with(s, |_| {
            AgentSupply::Local(LocalOptions {
                agent_bin: common::agent_bin(),
                pg_bin: None,
                pg_user: None,
                data_dir: s.data(),
                dataset_dir: s.data().join("datasets"),
                dataset_remote: None,
                netns: vec![],
                agent_metrics: false,
            })
        })
        .await
    }

    /// Runs' agents from `agents`, given the fake API's client.
    async fn start_with(
        s: &Scratch,
        agents: impl FnOnce(kube::Client) -> pgfleet_controller::controller::AgentSupply,
    ) -> Operator {
        use pgfleet_controller::controller::{Controller, ControllerConfig};
        std::fs::create_dir_all(s.store().parent().unwrap()).unwrap();
        let (client, fake) = FakeApi::start();
        let mut controller = Controller::build(&ControllerConfig {
            service: service_config(s, false),
            agents: agents(client.clone()),
            http: None,
            reports: s.out(),
            max_scenario_bytes: 1 << 20,
            max_queued_runs: 10,
            max_cells: 1000,
            allow_shell_scenarios: false,
            metrics_retention: Duration::from_secs(1),
        })
        .await
        .unwrap();
        let served = controller.served.clone();
        let stop = CancellationToken::new();
        let st = stop.clone();
        let drive = tokio::spawn(async move {
            controller.drive(None, &st).await;
            controller.shutdown().await;
        });
        let mut op = Operator {
            fake,
            client,
            served,
            stop,
            drive,
            reconciler: None,
        };
        op.start_reconciler();
        op
    }

    fn start_reconciler(&mut self) {
        let ctx = Arc::new(resource::Ctx {
            client: self.client.clone(),
            namespace: NS.into(),
            served: self.served.clone(),
            api_url: "http://pgfleet-controller.bench.svc:8080".into(),
            refresh: Duration::from_millis(300),
        });
        let stop = CancellationToken::new();
        let task = tokio::spawn(resource::run(ctx, stop.clone()));
        self.reconciler = Some((stop, task));
    }

    /// The reconciler stops and another starts (serve restarted).
    async fn restart_reconciler(&mut self) {
        if let Some((stop, task)) = self.reconciler.take() {
            stop.cancel();
            task.await.unwrap();
        }
        self.start_reconciler();
    }

    fn status(&self, name: &str) -> Value {
        self.fake
            .object("pgfleetruns", name)
            .map(|o| o["status"].clone())
            .unwrap_or(Value::Null)
    }

    /// Waits for the resource's phase; panics on another terminal one.
    async fn until_phase(&self, name: &str, phase: &str) -> Value {
        let deadline = std::time::Instant::now() + Duration::from_secs(180);
        loop {
            let st = self.status(name);
            if st["phase"] == phase {
                return st;
            }
            let terminal = [
                "Rejected",
                "Succeeded",
                "Failed",
                "Cancelled",
                "Interrupted",
            ];
            if terminal.contains(&st["phase"].as_str().unwrap_or("")) {
                panic!(
                    "{name} ended {} while waiting for {phase}: {st}",
                    st["phase"]
                );
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{name} not {phase} within 180 s: {st}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `kubectl delete pgfleetrun NAME`, waiting until it is gone.
    async fn delete(&self, name: &str) {
        self.fake.delete("pgfleetruns", name, &Value::Null);
        for _ in 0..1200 {
            if self.fake.object("pgfleetruns", name).is_none() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!(
            "{name} still there 120 s after its deletion: {:?}",
            self.fake.object("pgfleetruns", name)
        );
    }

    async fn stop(mut self) {
        if let Some((stop, task)) = self.reconciler.take() {
            stop.cancel();
            task.await.unwrap();
        }
        self.stop.cancel();
        self.drive.await.unwrap();
    }

    /// Each status patch the reconciler sent, in order.
    fn status_patches(&self, name: &str) -> Vec<Value> {
        self.fake
            .requests()
            .into_iter()
            .filter(|r| r.method == "PATCH" && r.path.ends_with(&format!("/{name}/status")))
            .map(|r| r.body["status"].clone())
            .collect()
    }
}

fn condition(status: &Value, t: &str) -> Value {
    status["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == t).cloned())
        .unwrap_or(Value::Null)
}

const QUICK: &str = r#"{
    "fleet": [{"name": "a"}],
    "workloads": [{"kind": "pgbench", "scale": 1, "clients": 1, "duration_s": 2}],
    "checks": [{"name": "some tps", "metric": {"name": "tps", "class": "a"}, "min": 1}]
}"#;

/// Create → Accepted → Running → Succeeded, in that order of status
/// patches, the finalizer first; the reconciler restarted mid-run (serve
/// restarted) finds the same run by the resource's uid and follows it;
/// `kubectl wait --for=condition=Succeeded` would return.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pgfleetrun_is_accepted_runs_and_succeeds_and_a_restarted_reconciler_follows_it() {
    let s = Scratch::new("k8s-pfr-ok");
    let mut op = Operator::start(&s).await;
    let spec: Value = serde_json::from_str(QUICK).unwrap();
    op.fake.put("pgfleetruns", pgfleetrun("quick", spec));
    let running = op.until_phase("quick", "Running").await;
    let run_id = running["runId"].as_str().unwrap().to_string();
    op.restart_reconciler().await;
    let done = op.until_phase("quick", "Succeeded").await;
    assert_eq!(done["runId"], run_id.as_str(), "{done}");
    assert_eq!(done["verdict"], "passed", "{done}");
    assert_eq!(done["cells"], "1/1", "{done}");
    assert_eq!(done["checks"]["passed"], 1, "{done}");
    assert_eq!(done["observedGeneration"], 1, "{done}");
    assert_eq!(
        done["reportUrl"],
        format!("http://pgfleet-controller.bench.svc:8080/v1/runs/{run_id}/report.html")
    );
    assert_eq!(condition(&done, "Accepted")["status"], "True");
    assert_eq!(condition(&done, "Succeeded")["status"], "True", "{done}");
    assert_eq!(condition(&done, "Failed")["status"], "False", "{done}");
    assert_eq!(condition(&done, "Running")["reason"], "Finished", "{done}");

    // One run, labelled with its resource.
    let runs = op.served.service.store.runs().unwrap();
    assert_eq!(
        runs.len(),
        1,
        "the restarted reconciler started no other run"
    );
    let labels = &runs[0].labels;
    assert_eq!(
        labels.0.get("pgfleetrun").map(String::as_str),
        Some("quick")
    );
    // The finalizer came before the first status, and the phases went
    // forward only.
    let requests = op.fake.requests();
    let first = |f: &dyn Fn(&Recorded) -> bool| requests.iter().position(f).unwrap();
    let finalizer = first(&|r| {
        r.method == "PATCH" && r.body["metadata"]["finalizers"] == json!(["pgfleet.io/run"])
    });
    let status = first(&|r| r.path.ends_with("/status"));
    assert!(finalizer < status, "the finalizer is added first");
    let order = ["Queued", "Running", "Succeeded"];
    let phases: Vec<usize> = op
        .status_patches("quick")
        .iter()
        .map(|p| {
            order
                .iter()
                .position(|o| p["phase"] == *o)
                .unwrap_or_else(|| panic!("unexpected phase in {p}"))
        })
        .collect();
    assert!(phases.windows(2).all(|w| w[0] <= w[1]), "{phases:?}");
    assert_eq!(phases.last(), Some(&2));
    // Finished: no more status patches while nothing changes.
    let n = op.status_patches("quick").len();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(op.status_patches("quick").len(), n);
    op.stop().await;
    s.assert_clean(&[]);
}

/// A spec the scenario's validation refuses: `Accepted=False`, phase
/// Rejected, the message with the field path in place of file:line, no
/// run; a spec a pod could not run (emulated caps) is refused the same way
/// under `--agents kubernetes` (the submission check, tested on serve).
#[tokio::test]
async fn a_resource_that_cannot_run_is_not_accepted_and_says_which_field() {
    let s = Scratch::new("k8s-pfr-bad");
    let op = Operator::start(&s).await;
    op.fake.put(
        "pgfleetruns",
        pgfleetrun(
            "bad",
            json!({"fleet": [{"name": "a"}],
                   "workloads": [{"kind": "pgbench", "scale": 0}]}),
        ),
    );
    let st = op.until_phase("bad", "Rejected").await;
    let accepted = condition(&st, "Accepted");
    assert_eq!(accepted["status"], "False", "{st}");
    assert_eq!(accepted["reason"], "InvalidScenario", "{st}");
    let m = accepted["message"].as_str().unwrap();
    assert!(m.starts_with("spec.workloads[0].scale: "), "{m}");
    assert_eq!(condition(&st, "Failed")["status"], "True", "{st}");
    assert!(op.served.service.store.runs().unwrap().is_empty());
    // Deleting it releases the finalizer at once (no run to cancel).
    op.delete("bad").await;
    op.stop().await;
}

/// `kubectl delete` mid-run: the run is cancelled, its clusters and agents
/// are gone, and only then the finalizer is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_pgfleetrun_mid_run_cancels_its_run_then_releases_the_finalizer() {
    let s = Scratch::new("k8s-pfr-del");
    let op = Operator::start(&s).await;
    op.fake.put(
        "pgfleetruns",
        pgfleetrun(
            "long",
            json!({"fleet": [{"name": "a"}],
                   "workloads": [{"kind": "pgbench", "scale": 1, "clients": 1, "duration_s": 120}]}),
        ),
    );
    let st = op.until_phase("long", "Running").await;
    let run_id = st["runId"].as_str().unwrap().to_string();
    // Until its cell runs (a cluster exists).
    let store = op.served.service.store.clone();
    for _ in 0..600 {
        if store
            .cells(&run_id)
            .unwrap()
            .iter()
            .any(|c| c.state == "running")
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let asked = std::time::Instant::now();
    op.delete("long").await;
    assert!(
        asked.elapsed() < Duration::from_secs(60),
        "a 120 s run is cancelled, not waited for"
    );
    let run = store.run(&run_id).unwrap().unwrap();
    assert_eq!(
        run.status, "cancelled",
        "the run ended before the finalizer went"
    );
    op.stop().await;
    s.assert_clean(&[]);
}

/// deploy/base/crd.yaml is what `pgfleet crd` generates from the scenario's
/// types; it is a valid CRD (kubernetes-validate); the example resource
/// (deploy/ci/pgfleetrun.yaml) follows its schema with unknown keys
/// refused, as `kubectl apply`'s strict field validation does, and is a
/// valid scenario for Kubernetes (`pgfleet validate --kubernetes`).
#[test]
fn the_pgfleetrun_crd_is_generated_valid_and_the_example_follows_it() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let committed = std::fs::read_to_string(repo.join("deploy/base/crd.yaml")).unwrap();
    let out = Command::new(pgfleet()).arg("crd").output().unwrap();
    assert!(out.status.success(), "{}", show(&out));
    let generated = String::from_utf8(out.stdout).unwrap();
    let first_difference = committed
        .lines()
        .zip(generated.lines())
        .position(|(a, b)| a != b)
        .map(|i| {
            format!(
                "line {}: `{}`",
                i + 1,
                generated.lines().nth(i).unwrap_or("")
            )
        });
    assert!(
        committed == generated,
        "deploy/base/crd.yaml is stale (generated {}): pgfleet crd > deploy/base/crd.yaml",
        first_difference.unwrap_or_else(|| "a different length".into())
    );
    validate_objects(&committed, "deploy/base/crd.yaml");

    // The schema, strict: an object with properties takes no others.
    fn strict(v: &mut Value) {
        if let Some(o) = v.as_object_mut() {
            if o.contains_key("properties")
                && !o.contains_key("x-kubernetes-preserve-unknown-fields")
            {
                o.insert("additionalProperties".into(), json!(false));
            }
            for (_, c) in o.iter_mut() {
                strict(c);
            }
        }
    }
    let mut schema = resource::crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone();
    strict(&mut schema);
    let example_path = repo.join("deploy/ci/pgfleetrun.yaml");
    let example: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(&example_path).unwrap()).unwrap();
    let s = Scratch::new("k8s-crd");
    let check = |doc: &Value| -> Output {
        let d = s.write("doc.json", &doc.to_string());
        let sc = s.write("schema.json", &schema.to_string());
        Command::new("/opt/pgfleet-venv/bin/python")
            .args([
                "-c",
                "import json, sys, jsonschema; jsonschema.validate(json.load(open(sys.argv[1])), json.load(open(sys.argv[2])))",
            ])
            .arg(d)
            .arg(sc)
            .output()
            .unwrap()
    };
    let ok = check(&example);
    assert!(ok.status.success(), "the example: {}", show(&ok));
    let mut typo = example.clone();
    typo["spec"]["fleet"][0]["storge"] = json!({"profile": "gp3"});
    let bad = check(&typo);
    assert!(!bad.status.success(), "an unknown key is refused");
    assert!(show(&bad).contains("storge"), "{}", show(&bad));
    let mut typo = example.clone();
    typo["spec"]["workloads"][0]["kind"] = json!("pgbnech");
    assert!(!check(&typo).status.success(), "an unknown kind is refused");

    // Its spec is a scenario Kubernetes can run.
    let mut spec = example["spec"].clone();
    spec["name"] = example["metadata"]["name"].clone();
    let file = s.write("example.yaml", &spec.to_string());
    let out = Command::new(pgfleet())
        .args(["validate", "--kubernetes", "--namespace", NS])
        .arg(&file)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", show(&out));
}

/// Under `--agents kubernetes`, a scenario a pod cannot run (emulated
/// storage caps) is refused when it is submitted (422 on the API, located
/// like any invalid scenario), not when its turn comes; the same scenario
/// with `emulate: false` is queued.
#[tokio::test]
async fn under_kubernetes_what_a_pod_cannot_run_is_refused_at_submission() {
    use pgfleet_controller::controller::{AgentSupply, Controller, ControllerConfig};
    use pgfleet_controller::queue::Rejected;
    let s = Scratch::new("k8s-submit");
    std::fs::create_dir_all(s.store().parent().unwrap()).unwrap();
    let (client, fake) = FakeApi::start();
    let controller = Controller::build(&ControllerConfig {
        service: service_config(&s, true),
        agents: AgentSupply::KubernetesClient(options(), client),
        http: None,
        reports: s.out(),
        max_scenario_bytes: 1 << 20,
        max_queued_runs: 10,
        max_cells: 1000,
        allow_shell_scenarios: false,
        metrics_retention: Duration::from_secs(1),
    })
    .await
    .unwrap();
    let yaml = |emulate: bool| {
        format!(
            "name: caps\nfleet:\n  - name: gp3\n    storage: {{ profile: gp3, emulate: {emulate}, storage_class: gp3 }}\nworkloads:\n  - kind: pgbench\n    scale: 1\n"
        )
    };
    match controller
        .served
        .submit("caps.yaml", &yaml(true), None, Default::default())
    {
        Err(Rejected::Invalid(e)) => {
            assert_eq!(e.field, "fleet[0].storage.emulate", "{e}");
            assert_eq!(e.line, 4, "{e}");
        }
        Err(_) => panic!("refused, but not as an invalid scenario"),
        Ok((id, _)) => panic!("queued as run {id}"),
    }
    assert!(controller.served.service.store.runs().unwrap().is_empty());
    let (id, created) = controller
        .served
        .submit("caps.yaml", &yaml(false), None, Default::default())
        .ok()
        .expect("emulate: false is queued");
    assert!(created && !id.is_empty());
    assert!(fake.names("pods").is_empty(), "nothing started: no drive");
    controller.shutdown().await;
}

/// A run submitted to `serve --agents kubernetes --dataset-snapshots` is
/// planned with what its volumes will start from: the gp3 class's volume
/// comes from a ready snapshot holding its dataset, so its cell is
/// estimated as a hydration and a restore (at the snapshot's size), not a
/// build; nvme, whose storage class keeps no snapshots, still builds. The
/// Kubernetes API is the fake (no API server can run here).
#[tokio::test]
async fn a_submitted_runs_plan_restores_what_its_volumes_snapshot_holds() {
    use pgfleet_controller::agents::Held;
    use pgfleet_controller::controller::{AgentSupply, Controller, ControllerConfig};
    use scenario::plan::{Holdings, plan_for};
    let s = Scratch::new("k8s-snapshot-plan");
    std::fs::create_dir_all(s.store().parent().unwrap()).unwrap();
    let sc = scenario();
    let opts = KubeOptions {
        dataset_snapshots: BTreeMap::from([("gp3".to_string(), "ebs-snapshots".to_string())]),
        ..options()
    };
    let empty = plan_for(&sc, &Holdings::per_agent(BTreeMap::new()));
    let key = |class: &str| {
        empty
            .iter()
            .find(|c| c.instance_class == class)
            .and_then(|c| c.params.dataset())
            .expect("pgbench has a dataset")
            .plan_key()
    };
    let held = Held {
        fingerprint: "pgbench-s1-0123456789abcdef".into(),
        plan_key: key("gp3"),
        label: "pgbench-s1".into(),
        bytes: empty[0].params.dataset().unwrap().pgdata_bytes(),
    };
    let (client, fake) = FakeApi::start();
    fake.put(
        "volumesnapshots",
        json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
            "metadata": {"name": "pgfleet-datasets-gp3-1", "namespace": NS,
                "creationTimestamp": "2026-12-01T00:00:00Z",
                "labels": {"app.kubernetes.io/managed-by": "pgfleet",
                           "app.kubernetes.io/component": "dataset-snapshot",
                           "pgfleet.io/storage-class": "gp3"},
                "annotations": {"pgfleet.io/datasets": json!([held]).to_string()}},
            "status": {"readyToUse": true, "restoreSize": "10Gi"}}),
    );
    let found = kubernetes::dataset_snapshots(&client, NS).await.unwrap();
    let holdings = kubernetes::holdings(&sc, &opts, &found);
    assert_eq!(
        holdings.snapshots,
        BTreeMap::from([(
            "gp3".to_string(),
            BTreeMap::from([(held.plan_key.clone(), held.bytes)])
        )])
    );
    // gp3's one agent restores one cell of it: one volume of its own.
    assert_eq!(
        holdings.cell_volumes,
        BTreeMap::from([("gp3".to_string(), 1)])
    );
    let controller = Controller::build(&ControllerConfig {
        service: service_config(&s, true),
        agents: AgentSupply::KubernetesClient(opts.clone(), client),
        http: None,
        reports: s.out(),
        max_scenario_bytes: 1 << 20,
        max_queued_runs: 10,
        max_cells: 1000,
        allow_shell_scenarios: false,
        metrics_retention: Duration::from_secs(1),
    })
    .await
    .unwrap();
    let (id, _) = controller
        .served
        .submit("k8s-test.yaml", SCENARIO, None, Default::default())
        .ok()
        .expect("queued");
    let stored = controller.served.service.store.cells(&id).unwrap();
    let planned = plan_for(&sc, &holdings);
    for c in &stored {
        let with = planned.iter().find(|p| p.cell_id == c.cell_id).unwrap();
        let without = empty.iter().find(|p| p.cell_id == c.cell_id).unwrap();
        assert_eq!(
            c.estimate_seconds,
            Some(with.estimate().seconds),
            "{}",
            c.cell_id
        );
        if c.instance_class == "gp3" {
            let share = with.share.as_ref().unwrap();
            assert_eq!(
                (with.how(), share.hydrates, share.in_place),
                ("restored", true, true)
            );
            assert_ne!(with.estimate(), without.estimate());
        } else {
            // nvme's volumes are not kept as snapshots and its one agent
            // has no second cell: a build would publish for nobody.
            assert_eq!(with, without, "{}", c.cell_id);
            assert_eq!(with.how(), "loaded");
        }
    }
    assert!(stored.iter().any(|c| c.instance_class == "gp3"));
    controller.shutdown().await;
}

/// deploy/overlays/eks/karpenter.yaml uses only fields the Karpenter v1 API
/// documents (karpenter.sh/docs/concepts/nodepools and nodeclasses, v1.x;
/// no Karpenter can run here to validate it), with their documented enum
/// values, and its pools label and taint nodes as the eksctl node groups
/// do, which the at-scale scenarios select and tolerate.
#[test]
fn the_karpenter_pools_use_documented_v1_fields_and_match_the_node_groups() {
    const NODEPOOL: &[&str] = &[
        "apiVersion",
        "kind",
        "metadata.name",
        "metadata.labels.*",
        "spec.template.metadata.labels.*",
        "spec.template.metadata.annotations.*",
        "spec.template.spec.nodeClassRef.group",
        "spec.template.spec.nodeClassRef.kind",
        "spec.template.spec.nodeClassRef.name",
        "spec.template.spec.requirements[].key",
        "spec.template.spec.requirements[].operator",
        "spec.template.spec.requirements[].values[]",
        "spec.template.spec.requirements[].minValues",
        "spec.template.spec.taints[].key",
        "spec.template.spec.taints[].value",
        "spec.template.spec.taints[].effect",
        "spec.template.spec.startupTaints[].key",
        "spec.template.spec.startupTaints[].value",
        "spec.template.spec.startupTaints[].effect",
        "spec.template.spec.expireAfter",
        "spec.template.spec.terminationGracePeriod",
        "spec.disruption.consolidationPolicy",
        "spec.disruption.consolidateAfter",
        "spec.disruption.budgets[].nodes",
        "spec.disruption.budgets[].schedule",
        "spec.disruption.budgets[].duration",
        "spec.disruption.budgets[].reasons[]",
        "spec.limits.*",
        "spec.weight",
    ];
    const NODECLASS: &[&str] = &[
        "apiVersion",
        "kind",
        "metadata.name",
        "metadata.labels.*",
        "spec.role",
        "spec.instanceProfile",
        "spec.amiFamily",
        "spec.amiSelectorTerms[].alias",
        "spec.amiSelectorTerms[].id",
        "spec.amiSelectorTerms[].name",
        "spec.amiSelectorTerms[].owner",
        "spec.amiSelectorTerms[].tags.*",
        "spec.subnetSelectorTerms[].id",
        "spec.subnetSelectorTerms[].tags.*",
        "spec.securityGroupSelectorTerms[].id",
        "spec.securityGroupSelectorTerms[].name",
        "spec.securityGroupSelectorTerms[].tags.*",
        "spec.userData",
        "spec.tags.*",
        "spec.instanceStorePolicy",
        "spec.detailedMonitoring",
        "spec.associatePublicIPAddress",
    ];
    fn paths(v: &Value, at: &str, out: &mut Vec<(String, Value)>) {
        let open = ["labels", "annotations", "tags", "limits"];
        match v {
            Value::Object(o) => {
                for (k, c) in o {
                    let last = at.rsplit('.').next().unwrap_or("");
                    let key = if open.contains(&last) {
                        "*"
                    } else {
                        k.as_str()
                    };
                    let p = if at.is_empty() {
                        key.to_string()
                    } else {
                        format!("{at}.{key}")
                    };
                    paths(c, &p, out);
                }
            }
            Value::Array(a) => {
                for c in a {
                    paths(c, &format!("{at}[]"), out);
                }
            }
            _ => out.push((at.to_string(), v.clone())),
        }
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let eks = repo.join("deploy/overlays/eks");
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&std::fs::read_to_string(eks.join("karpenter.yaml")).unwrap())
            .unwrap();
    let mut pools = BTreeMap::new();
    let mut classes = std::collections::BTreeSet::new();
    for d in &docs {
        let (api, allowed) = match d["kind"].as_str() {
            Some("NodePool") => ("karpenter.sh/v1", NODEPOOL),
            Some("EC2NodeClass") => ("karpenter.k8s.aws/v1", NODECLASS),
            k => panic!("unexpected kind {k:?}"),
        };
        assert_eq!(d["apiVersion"], api);
        let mut found = Vec::new();
        paths(d, "", &mut found);
        for (p, v) in &found {
            assert!(
                allowed.contains(&p.as_str()),
                "{}: `{p}` is not a Karpenter v1 field",
                d["metadata"]["name"]
            );
            let one_of = |ok: &[&str]| assert!(ok.contains(&v.as_str().unwrap_or("")), "{p}: {v}");
            match p.as_str() {
                "spec.disruption.consolidationPolicy" => {
                    one_of(&["WhenEmpty", "WhenEmptyOrUnderutilized"])
                }
                "spec.template.spec.taints[].effect" => {
                    one_of(&["NoSchedule", "PreferNoSchedule", "NoExecute"])
                }
                "spec.template.spec.requirements[].operator" => {
                    one_of(&["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"])
                }
                _ => {}
            }
        }
        if d["kind"] == "EC2NodeClass" {
            classes.insert(d["metadata"]["name"].as_str().unwrap().to_string());
        } else {
            let t = &d["spec"]["template"];
            assert_eq!(t["spec"]["nodeClassRef"]["kind"], "EC2NodeClass");
            // Never consolidate a node a benchmark runs on.
            assert_eq!(d["spec"]["disruption"]["consolidationPolicy"], "WhenEmpty");
            pools.insert(
                t["metadata"]["labels"]["pgfleet.io/pool"]
                    .as_str()
                    .unwrap()
                    .to_string(),
                (
                    t["spec"]["nodeClassRef"]["name"]
                        .as_str()
                        .unwrap()
                        .to_string(),
                    t["spec"]["taints"].clone(),
                    t["spec"]["requirements"].clone(),
                ),
            );
        }
    }
    for (class, _, _) in pools.values() {
        assert!(
            classes.contains(class),
            "NodePool names EC2NodeClass {class}, which is not there"
        );
    }
    // The same pools, labels and taints as the node groups.
    let groups: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(eks.join("eksctl-nodegroups.yaml")).unwrap(),
    )
    .unwrap();
    let mut benchmark_groups = 0;
    for g in groups["managedNodeGroups"].as_array().unwrap() {
        let pool = g["labels"]["pgfleet.io/pool"].as_str().unwrap();
        if pool == "system" {
            continue;
        }
        benchmark_groups += 1;
        let (_, taints, requirements) = pools
            .get(pool)
            .unwrap_or_else(|| panic!("no NodePool for pool {pool}"));
        assert_eq!(taints, &g["taints"], "pool {pool}'s taints");
        assert_eq!(
            requirements[0]["values"],
            json!([g["instanceType"]]),
            "pool {pool}'s instance type"
        );
    }
    assert_eq!(pools.len(), benchmark_groups);

    // The agent pods ask not to be disrupted.
    let objects = kubernetes::plan(&scenario(), RUN, &options()).unwrap();
    for a in &objects.agents {
        assert_eq!(
            a.pod
                .metadata
                .annotations
                .as_ref()
                .and_then(|m| m.get("karpenter.sh/do-not-disrupt"))
                .map(String::as_str),
            Some("true")
        );
    }
}

/// `cleanup: {on_failure: keep, ttl}`: a failed run's pods, volumes and
/// owner stay, the owner annotated with when they go; the reaper leaves
/// them until then and deletes them after; a succeeded run's objects are
/// deleted as always. Bad values are located scenario errors.
#[tokio::test]
async fn kept_objects_stay_until_their_ttl_and_the_reaper_then_deletes_them() {
    let yaml = format!("{SCENARIO}cleanup: {{ on_failure: keep, ttl: 2h }}\n");
    let sc = scenario::parse(Path::new("keep.yaml"), &yaml).unwrap();
    let (client, fake) = FakeApi::start();
    let (tx, _rx) = mpsc::channel(64);
    let opts = KubeOptions {
        exit_grace: Duration::from_millis(100),
        ..options()
    };
    let mut agents = KubeAgents::launch(client.clone(), &sc, RUN, &opts, tx.clone())
        .await
        .unwrap();
    let kept = agents
        .end(RunEnd {
            succeeded: false,
            ..Default::default()
        })
        .await
        .expect("a failed run keeps");
    let objects = kept["objects"].as_array().unwrap();
    assert_eq!(objects.len(), 1 + 2 * 3, "{kept}");
    assert_eq!(fake.names("pods").len(), 3);
    assert_eq!(fake.names("persistentvolumeclaims").len(), 3);
    let owner = kubernetes::owner_name(RUN);
    let until = fake.object("configmaps", &owner).unwrap()["metadata"]["annotations"]
        [kubernetes::KEEP_UNTIL]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(kept["until"], until.as_str());
    let left = chrono::DateTime::parse_from_rfc3339(&until)
        .unwrap()
        .with_timezone(&chrono::Utc)
        - chrono::Utc::now();
    assert!(
        (7100..=7200).contains(&left.num_seconds()),
        "{left:?} left of a 2 h ttl"
    );
    // Not running, but kept: the reaper leaves it.
    assert!(
        kubernetes::reap(&client, NS, |_| false)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(fake.names("pods").len(), 3);
    // Its time is up: deleted, with its pods and volumes.
    {
        let mut st = fake.lock();
        let cm = st
            .objects
            .get_mut(&("configmaps".to_string(), owner.clone()))
            .unwrap();
        cm["metadata"]["annotations"][kubernetes::KEEP_UNTIL] = json!("2026-01-01T00:00:00Z");
    }
    assert_eq!(
        kubernetes::reap(&client, NS, |_| false).await.unwrap(),
        vec![RUN.to_string()]
    );
    assert!(fake.names("pods").is_empty() && fake.names("persistentvolumeclaims").is_empty());

    // A succeeded run with the same scenario: on_success defaults to delete.
    let mut agents = KubeAgents::launch(client.clone(), &sc, RUN, &opts, tx)
        .await
        .unwrap();
    assert!(
        agents
            .end(RunEnd {
                succeeded: true,
                ..Default::default()
            })
            .await
            .is_none()
    );
    assert!(fake.names("pods").is_empty() && fake.names("configmaps").is_empty());

    let s = Scratch::new("k8s-cleanup");
    for (cleanup, want) in [
        (
            "{ on_failure: maybe }",
            "unknown cleanup `maybe`: allowed delete, keep",
        ),
        ("{ ttl: 5 }", "not a duration"),
        ("{ ttl: 90d }", "allowed 1m to 30d"),
        ("{ on_error: keep }", "unknown field `on_error`"),
    ] {
        let p = s.write(
            "c.yaml",
            &format!("name: t\nfleet:\n  - name: a\ncleanup: {cleanup}\nworkloads:\n  - kind: pgbench\n    scale: 1\n"),
        );
        let out = Command::new(pgfleet())
            .arg("validate")
            .arg(&p)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{cleanup}: {err}");
        assert!(
            err.contains("c.yaml:4:") && err.contains(want),
            "{cleanup}: {err}"
        );
    }
}

/// On the Kubernetes source: a resource's run creates its pods and volumes
/// (which stay Pending here: no kubelet); `kubectl delete` cancels the run,
/// its owner goes with its pods and volumes (foreground propagation), and
/// only then the finalizer is released.
#[tokio::test]
async fn deleting_a_resource_deletes_its_runs_pods_and_volumes_before_its_finalizer() {
    use pgfleet_controller::controller::AgentSupply;
    let s = Scratch::new("k8s-pfr-pods");
    let op = Operator::start_with(&s, |client| {
        AgentSupply::KubernetesClient(options(), client)
    })
    .await;
    let spec = json!({"fleet": [{"name": "a", "count": 2,
                                  "storage": {"profile": "gp3", "emulate": false, "storage_class": "gp3"}}],
                      "workloads": [{"kind": "pgbench", "scale": 1}]});
    op.fake.put("pgfleetruns", pgfleetrun("pods", spec));
    let st = op.until_phase("pods", "Running").await;
    let run_id = st["runId"].as_str().unwrap().to_string();
    until("the run's pods", || op.fake.names("pods").len() == 2).await;
    assert_eq!(op.fake.names("persistentvolumeclaims").len(), 2);
    op.delete("pods").await;
    assert!(
        op.fake.names("pods").is_empty(),
        "{:?}",
        op.fake.names("pods")
    );
    assert!(op.fake.names("persistentvolumeclaims").is_empty());
    assert!(op.fake.names("configmaps").is_empty());
    let run = op.served.service.store.run(&run_id).unwrap().unwrap();
    assert_eq!(run.status, "cancelled");
    // The finalizer went after the owner's deletion.
    let requests = op.fake.requests();
    let owner_deleted = requests
        .iter()
        .position(|r| r.method == "DELETE" && r.path.contains("/configmaps/"))
        .expect("the owner was deleted");
    let released = requests
        .iter()
        .rposition(|r| r.method == "PATCH" && r.path.ends_with("/pgfleetruns/pods"))
        .unwrap();
    assert!(owner_deleted < released, "the finalizer is released last");
    op.stop().await;
}

/// Datasets kept as CSI snapshots (`--dataset-snapshots gp3=ebs-snapshots`),
/// against the fake API server standing in for the API server and the
/// snapshot controller (no CSI driver can run here): see `snapshot_flow`.
#[tokio::test]
async fn datasets_are_kept_as_volume_snapshots_and_later_volumes_start_from_them() {
    snapshot_flow().await;
}

/// A run whose gp3 agent built a dataset ends: its volume is snapshotted
/// after its pod ended and before the run's objects are deleted (the
/// deletion waits for the snapshot to be cut), into a VolumeSnapshot the
/// run does not own, labelled and annotated with the dataset; nvme
/// (local-nvme, not mapped) is not. The next run's gp3 volume starts from
/// it (the newest ready one of its storage class holding its dataset, at
/// least its restore size), its pod is told; a snapshot that fails is
/// deleted. Returns every request, for the RBAC test.
async fn snapshot_flow() -> Vec<Recorded> {
    use pgfleet_controller::agents::Held;
    let opts = KubeOptions {
        dataset_snapshots: BTreeMap::from([("gp3".to_string(), "ebs-snapshots".to_string())]),
        snapshot_cut_timeout: Duration::from_secs(20),
        ..options()
    };
    let plan_key = scenario::plan(&scenario())
        .into_iter()
        .find(|c| c.instance_class == "gp3")
        .and_then(|c| c.share)
        .expect("pgbench shares a dataset")
        .key;
    let held = Held {
        fingerprint: "pgbench-s1-0123456789abcdef".into(),
        plan_key: plan_key.clone(),
        label: "pgbench-s1".into(),
        bytes: 30 << 20,
    };
    let (client, fake) = FakeApi::start();
    let run = |id: &str| {
        let (client, opts, id) = (client.clone(), opts.clone(), id.to_string());
        async move {
            let (tx, rx) = mpsc::channel(64);
            let agents = KubeAgents::launch(client, &scenario(), &id, &opts, tx)
                .await
                .unwrap();
            (agents, rx)
        }
    };
    let gp3 = |run: &str| format!("pgfleet-{run}-gp3-0");
    let exit_all = |fake: &FakeApi, agents: &KubeAgents| {
        for l in agents.launched() {
            fake.update_pod(&l.agent_id, |p| p["status"] = json!({"phase": "Succeeded"}));
        }
    };

    // Run 1: nothing to start from.
    let (mut agents, _rx) = run(RUN).await;
    let pvc = fake
        .object("persistentvolumeclaims", &format!("{}-data", gp3(RUN)))
        .unwrap();
    assert!(pvc["spec"]["dataSource"].is_null(), "{pvc}");
    exit_all(&fake, &agents);
    let snap = format!("{}-datasets", gp3(RUN));
    // The snapshot controller cuts it a moment after it is asked.
    let cutter = {
        let (fake, snap) = (fake.clone(), snap.clone());
        tokio::spawn(async move {
            until("the snapshot is asked for", || {
                fake.object("volumesnapshots", &snap).is_some()
            })
            .await;
            tokio::time::sleep(Duration::from_millis(1500)).await;
            let at = fake.requests().len();
            fake.update("volumesnapshots", &snap, |o| {
                o["status"] = json!({"creationTime": "2026-12-01T10:05:00Z", "readyToUse": true, "restoreSize": "120Gi"})
            });
            at
        })
    };
    let gained = BTreeMap::from([
        (gp3(RUN), vec![held.clone()]),
        (format!("pgfleet-{RUN}-nvme-0"), vec![held.clone()]),
    ]);
    assert!(
        agents
            .end(RunEnd {
                succeeded: true,
                gained
            })
            .await
            .is_none()
    );
    let cut_at = cutter.await.unwrap();
    let requests = fake.requests();
    let creates: Vec<&Recorded> = requests
        .iter()
        .filter(|r| r.method == "POST" && r.path.ends_with("/volumesnapshots"))
        .collect();
    assert_eq!(
        creates.len(),
        1,
        "gp3 only: local-nvme has no snapshot class"
    );
    let body = &creates[0].body;
    assert_eq!(
        creates[0].path,
        format!("/apis/snapshot.storage.k8s.io/v1/namespaces/{NS}/volumesnapshots")
    );
    assert_eq!(body["metadata"]["name"], snap.as_str());
    assert_eq!(body["spec"]["volumeSnapshotClassName"], "ebs-snapshots");
    assert_eq!(
        body["spec"]["source"]["persistentVolumeClaimName"],
        format!("{}-data", gp3(RUN))
    );
    assert!(
        body["metadata"]["ownerReferences"].is_null(),
        "outlives the run: {body}"
    );
    assert_eq!(
        body["metadata"]["labels"]["pgfleet.io/storage-class"],
        "gp3"
    );
    assert_eq!(
        body["metadata"]["labels"]["app.kubernetes.io/component"],
        "dataset-snapshot"
    );
    let listed: Vec<Held> = serde_json::from_str(
        body["metadata"]["annotations"]["pgfleet.io/datasets"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(listed, vec![held.clone()]);
    let deleted_at = requests
        .iter()
        .position(|r| r.method == "DELETE" && r.path.ends_with(&format!("pgfleet-run-{RUN}")))
        .expect("the run's objects are deleted");
    assert!(
        deleted_at > cut_at,
        "the volume is deleted only once its snapshot is cut ({deleted_at} vs {cut_at})"
    );
    assert_eq!(fake.names("volumesnapshots"), vec![snap.clone()]);
    assert!(fake.names("persistentvolumeclaims").is_empty());

    // Snapshots run 2 must not start from: not ready, another storage
    // class, other datasets; and an older one of fewer datasets.
    let other = |name: &str, sc: &str, ready: bool, datasets: &Value, created: &str| {
        json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
            "metadata": {"name": name, "namespace": NS, "creationTimestamp": created,
                "labels": {"app.kubernetes.io/managed-by": "pgfleet",
                           "app.kubernetes.io/component": "dataset-snapshot",
                           "pgfleet.io/storage-class": sc},
                "annotations": {"pgfleet.io/datasets": datasets.to_string()}},
            "status": {"readyToUse": ready, "restoreSize": "10Gi"}})
    };
    let mine = json!([held]);
    let unrelated = json!([{"fingerprint": "toast-x", "plan_key": "[\"toast\",{}]", "label": "toast", "bytes": 1}]);
    fake.put(
        "volumesnapshots",
        other("not-ready", "gp3", false, &mine, "2026-12-02T00:00:00Z"),
    );
    fake.put(
        "volumesnapshots",
        other("io2", "io2", true, &mine, "2026-12-02T00:00:00Z"),
    );
    fake.put(
        "volumesnapshots",
        other("unrelated", "gp3", true, &unrelated, "2026-12-02T00:00:00Z"),
    );
    fake.put(
        "volumesnapshots",
        other("older", "gp3", true, &mine, "2026-11-01T00:00:00Z"),
    );

    // Run 2: the gp3 volume starts from run 1's snapshot.
    let run2 = "20261201-110000-abcdef";
    let (agents, _rx) = run(run2).await;
    let pvc = fake
        .object("persistentvolumeclaims", &format!("{}-data", gp3(run2)))
        .unwrap();
    assert_eq!(
        pvc["spec"]["dataSource"],
        json!({"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": snap}),
        "{pvc}"
    );
    assert_eq!(
        pvc["spec"]["resources"]["requests"]["storage"], "120Gi",
        "at least the snapshot's restore size"
    );
    let came_with: Vec<Held> = serde_json::from_str(
        pvc["metadata"]["annotations"]["pgfleet.io/datasets"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(came_with, vec![held.clone()], "{pvc}");
    let pod = fake.object("pods", &gp3(run2)).unwrap();
    let env = &pod["spec"]["containers"][0]["env"];
    assert!(
        env.as_array()
            .unwrap()
            .contains(&json!({"name": "PGFLEET_VOLUME_SNAPSHOT", "value": snap})),
        "{env}"
    );
    // Its one cell of that dataset gets a volume of the snapshot to
    // itself, which the agent uses in place (no copy): made with the data
    // volume, owned by the run, mounted and named to the agent.
    let cell = fake
        .object("persistentvolumeclaims", &format!("{}-cell-0", gp3(run2)))
        .unwrap();
    assert_eq!(cell["spec"]["dataSource"], pvc["spec"]["dataSource"]);
    assert_eq!(cell["spec"]["resources"]["requests"]["storage"], "120Gi");
    assert_eq!(cell["spec"]["storageClassName"], "gp3");
    assert_eq!(
        cell["metadata"]["labels"]["app.kubernetes.io/component"],
        "agent-cell-data"
    );
    let owner_uid = &pvc["metadata"]["ownerReferences"][0]["uid"];
    assert!(owner_uid.as_str().is_some_and(|u| !u.is_empty()), "{pvc}");
    assert_eq!(&cell["metadata"]["ownerReferences"][0]["uid"], owner_uid);
    assert!(
        fake.object("persistentvolumeclaims", &format!("{}-cell-1", gp3(run2)))
            .is_none(),
        "one volume per cell the agent restores"
    );
    let claim = format!("{}-cell-0", gp3(run2));
    assert!(
        pod["spec"]["volumes"]
            .as_array()
            .unwrap()
            .contains(&json!({"name": "cell-0", "persistentVolumeClaim": {"claimName": claim}})),
        "{pod}"
    );
    assert!(
        pod["spec"]["containers"][0]["volumeMounts"]
            .as_array()
            .unwrap()
            .contains(&json!({"name": "cell-0", "mountPath": "/cells/0"})),
        "{pod}"
    );
    assert!(
        env.as_array()
            .unwrap()
            .contains(&json!({"name": "PGFLEET_CELL_VOLUMES", "value": "/cells/0"})),
        "{env}"
    );
    let nvme = fake
        .object(
            "persistentvolumeclaims",
            &format!("pgfleet-{run2}-nvme-0-data"),
        )
        .unwrap();
    assert!(nvme["spec"]["dataSource"].is_null());
    assert!(
        fake.object(
            "persistentvolumeclaims",
            &format!("pgfleet-{run2}-nvme-0-cell-0")
        )
        .is_none()
    );

    // serve restarts mid-run: the run is attached again, and knows what
    // its volumes came with from their annotation. It gained another
    // dataset; its snapshot fails: deleted, and said.
    let launched = agents.launched();
    drop(agents);
    let (tx, _rx2) = mpsc::channel(64);
    let mut agents = KubeAgents::attach(client.clone(), run2, &opts, launched, tx, &scenario());
    exit_all(&fake, &agents);
    let snap2 = format!("{}-datasets", gp3(run2));
    let failer = {
        let (fake, snap2) = (fake.clone(), snap2.clone());
        tokio::spawn(async move {
            until("the second snapshot is asked for", || {
                fake.object("volumesnapshots", &snap2).is_some()
            })
            .await;
            fake.update("volumesnapshots", &snap2, |o| {
                o["status"] = json!({"readyToUse": false, "error": {"message": "EBS: SnapshotLimitExceeded"}})
            });
        })
    };
    let toast = Held {
        fingerprint: "toast-0123".into(),
        plan_key: "[\"toast\",{}]".into(),
        label: "toast".into(),
        bytes: 1,
    };
    agents
        .end(RunEnd {
            succeeded: true,
            gained: BTreeMap::from([(gp3(run2), vec![toast.clone()])]),
        })
        .await;
    failer.await.unwrap();
    let requests = fake.requests();
    let second = requests
        .iter()
        .find(|r| r.method == "POST" && r.body["metadata"]["name"] == snap2.as_str())
        .unwrap();
    let listed: Vec<Held> = serde_json::from_str(
        second.body["metadata"]["annotations"]["pgfleet.io/datasets"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        listed,
        vec![held, toast],
        "what the volume came with and what it gained"
    );
    assert!(
        requests
            .iter()
            .any(|r| r.method == "DELETE" && r.path.ends_with(&format!("volumesnapshots/{snap2}"))),
        "a failed snapshot is deleted"
    );
    assert!(!fake.names("volumesnapshots").contains(&snap2));
    assert!(
        fake.names("persistentvolumeclaims").is_empty(),
        "the data and cell volumes went with the run's owner: {:?}",
        fake.names("persistentvolumeclaims")
    );
    // Pruned: the older snapshot of the same datasets (run 1's supersedes
    // it); not the others (not ready, another class, other datasets).
    let mut left = fake.names("volumesnapshots");
    left.sort();
    let mut want = vec![
        snap.clone(),
        "io2".into(),
        "not-ready".into(),
        "unrelated".into(),
    ];
    want.sort();
    assert_eq!(left, want);
    assert!(
        requests
            .iter()
            .any(|r| r.method == "DELETE" && r.path.ends_with("volumesnapshots/older"))
    );
    requests
}
