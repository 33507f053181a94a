//! Planning: a validated scenario becomes cells. A cell is one unit of work
//! on one fresh cluster of one instance class; the scheduler places each on
//! an idle agent of that class.
//!
//! Each kind decides how an entry splits (`KindSpec::plan`: toast-slice one
//! cell per dataset, the others one); the entry runs on every class it names
//! (`on`, default all), `replicas: N` times per class, each on its own
//! fresh cluster.

use std::collections::BTreeMap;

use pgfleet_proto::workload::pgbench_init::LoadMethod;
use pgfleet_proto::workload::{Estimate, Kind, Params, Phases};

use super::Scenario;

#[derive(Debug, Clone, PartialEq)]
pub struct PlannedCell {
    pub cell_id: String,
    pub instance_class: String,
    /// Each role and the class it runs on, the lead first; one role named
    /// "" on `instance_class` for single-role kinds.
    pub roles: Vec<(String, String)>,
    /// The kind's parameters (defaults applied, offsets resolved).
    pub params: Params,
    pub settings: BTreeMap<String, String>,
    /// `reuse` or `fresh` (the entry's `data`).
    pub dataset: pgfleet_proto::dataset::Mode,
    /// The entry's `reuse_cluster`.
    pub reuse_cluster: bool,
    /// The cell's estimate in this plan: with `reuse`, the first cell of a
    /// dataset builds and publishes it, later ones restore it.
    pub estimate: Estimate,
    /// Its point in its entry's sweep: (key, value as written); empty when
    /// the entry sweeps nothing.
    pub point: Vec<(String, String)>,
    /// What its class gives it, for its estimate.
    pub capacity: pgfleet_proto::workload::Capacity,
    /// With `data: reuse`: the dataset it shares with the plan's other
    /// cells, and whether it is the one that builds it.
    pub share: Option<Share>,
    /// What earlier cells took against the model, applied to `estimate`
    /// (`learned::Learned::apply`); `learned_fresh` the same for
    /// `fresh_estimate` (a load of its own). `model` is the estimate
    /// before them.
    pub learned: Corrections,
    pub learned_fresh: Corrections,
    pub model: Option<Estimate>,
    /// `data: reuse`, but the plan has it load its own data, and why
    /// (`load_where_restoring_is_slower`).
    pub loads_instead: Option<&'static str>,
}

/// A correction of the model learned from earlier cells: the median of
/// what they took over what the model said (of one part of a cell), of how
/// many cells, and the runs they were in, newest first.
#[derive(Debug, Clone, PartialEq)]
pub struct Factor {
    pub ratio: f64,
    pub cells: usize,
    pub runs: Vec<String>,
}

/// The corrections of a cell's estimate, each learned where the model's
/// error has one cause: `data` (moving its data: `Phases::data`) from
/// cells of its class's capacity that came by their data the same way
/// (built, restored, ...), of any kind; `work` (the rest: preparing,
/// measuring, provisioning) from cells of its kind and class capacity,
/// however they came by their data, so a restored cell learns from a
/// built one's measuring. A kind without a dataset learns its whole as
/// `work` (both are that factor).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Corrections {
    pub data: Option<Factor>,
    pub work: Option<Factor>,
}

impl Corrections {
    pub fn is_empty(&self) -> bool {
        self.data.is_none() && self.work.is_none()
    }

    /// The runs the corrections were learned from, newest first.
    pub fn runs(&self) -> Vec<&str> {
        let mut runs: Vec<&str> = Vec::new();
        for f in self.data.iter().chain(&self.work) {
            for r in &f.runs {
                if !runs.contains(&r.as_str()) {
                    runs.push(r);
                }
            }
        }
        runs
    }

    /// "data 0.81x, the rest 1.30x" (what `validate` shows beside a cell).
    pub fn describe(&self) -> String {
        let f =
            |name: &str, f: &Option<Factor>| f.as_ref().map(|f| format!("{name} {:.2}x", f.ratio));
        if self.data == self.work {
            return f("all", &self.work).unwrap_or_default();
        }
        [f("data", &self.data), f("the rest", &self.work)]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// `e` with its data movement times the `data` ratio and the rest
    /// times the `work` ratio. A timed measurement keeps the length the
    /// scenario asks for (within the whole): the rest's correction goes to
    /// its preparation and the rest.
    pub fn scale(&self, e: Estimate) -> Estimate {
        if self.is_empty() {
            return e;
        }
        let ratio = |f: &Option<Factor>| f.as_ref().map_or(1.0, |f| f.ratio);
        let (d, w) = (ratio(&self.data), ratio(&self.work));
        let p = e.phases();
        let work = (e.seconds - p.data).max(0.0) * w;
        let measured = e.measured_seconds.min(work);
        let rest = p.prepare + p.other;
        let k = if rest > 0.0 {
            (work - measured).max(0.0) / rest
        } else {
            0.0
        };
        Estimate {
            seconds: p.data * d + work,
            measured_seconds: measured,
            load_seconds: e.load_seconds * d,
            hydrate_seconds: e.hydrate_seconds * d,
            publish_seconds: e.publish_seconds * d,
            prepare_seconds: e.prepare_seconds * k,
            ..e
        }
    }
}

/// A dataset shared by several cells of a plan. With one store for the
/// fleet, one cell builds it: the one whose class loads it fastest (the
/// least capped), so a capped class does not make the others wait for its
/// slow load; the scheduler holds the other cells of the dataset until it
/// is ready when their agents share a dataset store
/// (`Core::waits_for_dataset`). With a store per agent, each agent's first
/// cell of it builds it and nothing waits.
#[derive(Debug, Clone, PartialEq)]
pub struct Share {
    /// The dataset's loader and data-shaping keys (the fingerprint without
    /// the PostgreSQL build, which the agents add).
    pub key: String,
    pub builds: bool,
    /// Where the plan's agents keep datasets.
    pub stores: Stores,
    /// Already in the store the run's agents restore from: every cell
    /// restores it, none builds it.
    pub published: bool,
    /// For the builder: seconds from its start until the dataset is
    /// published (load and publish), for the plan's wall clock.
    pub ready_seconds: f64,
    /// It reuses the cluster an earlier cell of the dataset kept on its
    /// agent (`reuse_cluster`): a reset instead of a restore.
    pub reuses_cluster: bool,
    /// Its agent's volume was made from a dataset snapshot holding it
    /// (Kubernetes) and this cell is that agent's first of it, or it has a
    /// volume of the snapshot to itself (`in_place`): it reads the dataset
    /// in full (hydration) before restoring it.
    pub hydrates: bool,
    /// It has a volume made from the snapshot for itself (Kubernetes,
    /// `Holdings::cell_volumes`): the dataset is used where it lies, no
    /// copy.
    pub in_place: bool,
}

impl Share {
    /// Whether the cell starts only once the dataset's builder published it.
    pub fn waits(&self) -> bool {
        self.stores == Stores::Shared && !self.builds && !self.published
    }
}

/// Where a plan's agents keep datasets, for its estimates.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Stores {
    /// One store for the fleet: local agents (`<data-dir>/datasets`), or
    /// pods behind one object store (`--dataset-remote`). A dataset is
    /// built once; its other cells restore it.
    #[default]
    Shared,
    /// A store per agent: Kubernetes pods without an object store, each on
    /// its run's volume. Each agent's first cell of a dataset builds it
    /// (the plan takes a class's first `count` cells of it), its later
    /// cells restore it; no agent waits for another's build.
    PerAgent,
}

/// The workload entry (index in `workloads`) a cell belongs to: its id
/// starts `w<index>-` (as `plan` names it).
pub fn entry_of(cell_id: &str) -> Option<usize> {
    cell_id.strip_prefix('w')?.split('-').next()?.parse().ok()
}

impl PlannedCell {
    /// Whether the cell has several roles, each on its own agent.
    pub fn multi_role(&self) -> bool {
        self.roles.len() > 1
    }

    /// The instance class of the agent whose store builds or restores the
    /// cell's dataset (its dataset role's).
    pub fn dataset_class(&self) -> &str {
        let role = self.params.dataset_role();
        self.roles
            .iter()
            .find(|(r, _)| r == role)
            .map_or(&self.instance_class, |(_, class)| class)
    }

    /// The workload kind, e.g. `toast-slice`.
    pub fn workload(&self) -> Kind {
        self.params.kind()
    }
    pub fn estimate(&self) -> Estimate {
        self.estimate
    }
    /// The estimate when the cell loads its own data (`data: fresh`).
    pub fn fresh_estimate(&self) -> Estimate {
        self.learned_fresh
            .scale(self.params.estimate(&self.capacity))
    }

    /// How the plan has the cell come by its data, in the words of the
    /// agent's provenance (`environment.dataset.how`): `built`,
    /// `restored`, `reused`, `loaded` (`data: fresh`), or `none` for a kind
    /// without a dataset.
    pub fn how(&self) -> &'static str {
        match (&self.share, self.params.dataset()) {
            (_, None) => "none",
            (None, Some(_)) => "loaded",
            (Some(s), _) if s.reuses_cluster => "reused",
            (Some(s), _) if s.builds => "built",
            (Some(_), _) => "restored",
        }
    }

    /// The estimate before learned corrections.
    pub fn model_estimate(&self) -> Estimate {
        self.model.unwrap_or(self.estimate)
    }

    /// What the model's estimate of the cell depends on besides its
    /// parameters: its kind and what its class gives it. Earlier cells of
    /// the same key teach the correction of all but its data movement
    /// (`Corrections::work`).
    pub fn estimate_key(&self) -> String {
        format!("{} {}", self.workload().name(), self.capacity_key())
    }

    /// What its class gives it: the instance's CPUs and memory, the
    /// storage's caps. Earlier cells of the same capacity that came by
    /// their data the same way teach its data movement's correction
    /// (`Corrections::data`).
    pub fn capacity_key(&self) -> String {
        let (c, caps) = (&self.capacity, &self.capacity.caps);
        format!(
            "cpus={:.2} memory={} caps={}/{}/{}/{}",
            c.cpus,
            c.memory_bytes,
            caps.read_iops,
            caps.write_iops,
            caps.read_mbps,
            caps.write_mbps
        )
    }
}

/// The datasets already in the store a run's agents restore from, by plan
/// key (`Dataset::plan_key`): the loader's version and the bytes of the
/// published PGDATA. The PostgreSQL build is not compared (only an agent
/// knows its own): a dataset published by another major version is taken
/// as published, and that cell's estimate as a restore.
pub type Published = BTreeMap<String, (u32, u64)>;

/// What the stores a plan's agents restore from hold before the run, for
/// its estimates.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Holdings {
    pub stores: Stores,
    /// With one store for the fleet: what it holds.
    pub published: Published,
    /// With a store per agent (Kubernetes pods): by instance class, the
    /// datasets its agents' volumes start with, those of the dataset
    /// snapshot each volume is made from (plan key -> bytes). Every cell of
    /// such a dataset restores it; each agent's first reads it in full
    /// first (hydration: the volume fetches its blocks lazily).
    pub snapshots: BTreeMap<String, BTreeMap<String, u64>>,
    /// By instance class, how many volumes made from its snapshot for one
    /// cell each every agent of it gets (`restores_per_agent`, bounded):
    /// its first cells of a held dataset use one in place.
    pub cell_volumes: BTreeMap<String, u32>,
    /// With a store per agent, the classes whose agents' volumes are kept
    /// as dataset snapshots at a run's end (`--dataset-snapshots`): a
    /// dataset built there serves later runs too.
    pub snapshotted: std::collections::BTreeSet<String>,
}

impl Holdings {
    /// One store for the fleet, holding `published`.
    pub fn shared(published: Published) -> Holdings {
        Holdings {
            published,
            ..Holdings::default()
        }
    }
    /// A store per agent, whose volumes start with `snapshots`.
    pub fn per_agent(snapshots: BTreeMap<String, BTreeMap<String, u64>>) -> Holdings {
        Holdings {
            stores: Stores::PerAgent,
            snapshots,
            ..Holdings::default()
        }
    }
}

/// By instance class, the most cells of datasets its snapshot holds
/// (`held.snapshots`) that one agent of it restores (not reusing a kept
/// cluster, nor loading because that is faster) given a volume of the
/// snapshot each: what a volume per cell would take.
pub fn restores_per_agent(s: &Scenario, held: &Holdings) -> BTreeMap<String, u32> {
    // As if every such cell had a volume: those that would restore in
    // place rather than load (`load_where_restoring_is_slower`).
    let unbounded = Holdings {
        cell_volumes: held
            .snapshots
            .keys()
            .map(|c| (c.clone(), 100_000))
            .collect(),
        ..held.clone()
    };
    let mut cells: BTreeMap<String, u32> = BTreeMap::new();
    for c in plan_for(s, &unbounded) {
        if c.share.as_ref().is_some_and(|sh| sh.in_place) {
            *cells.entry(c.dataset_class().to_string()).or_default() += 1;
        }
    }
    cells
        .into_iter()
        .map(|(class, n)| {
            let agents = agents_of(s, &class);
            (class, n.div_ceil(agents))
        })
        .collect()
}

/// `Published` of a store's manifests.
pub fn published(manifests: &[pgfleet_proto::dataset::Manifest]) -> Published {
    manifests
        .iter()
        .map(|m| (m.dataset.plan_key(), (m.dataset.loader_version, m.bytes)))
        .collect()
}

/// What the local store at `dir` holds (nothing when it cannot be read:
/// the plan then estimates builds, which is all this is for).
pub fn published_in(dir: &std::path::Path) -> Published {
    published(
        &pgfleet_proto::dataset::LocalStore::new(dir)
            .list()
            .unwrap_or_default(),
    )
}

/// Each cell's estimate with datasets reused: the builder of a dataset
/// (see `Share`) loads it and publishes it (a copy into the store), the
/// others restore it instead of loading (a copy onto the class's storage,
/// then the data read back through the server); a dataset already
/// `published` has no builder: every cell restores it. With a store per
/// agent (Kubernetes), each agent's first cell of a dataset builds it,
/// unless the agent's volume comes from a snapshot holding it: then every
/// cell restores it and each agent's first reads it in full first.
fn reuse_estimates(s: &Scenario, cells: &mut [PlannedCell], held: &Holdings) {
    let (published, stores) = (&held.published, held.stores);
    use pgfleet_proto::dataset::{
        ESTIMATE_COPY_BYTES_PER_SECOND as RATE, ESTIMATE_REWARM_BYTES_PER_SECOND as REWARM, Mode,
    };
    use pgfleet_proto::workload::Work;
    // Shared: the builder of each dataset, the cell that loads it fastest
    // (the first in plan order among equals). Per agent: a class's first
    // `count` cells of it, one per agent.
    let mut builders: BTreeMap<String, (usize, f64)> = BTreeMap::new();
    let mut per_agent: BTreeMap<(String, String), u32> = BTreeMap::new();
    let mut builds = vec![false; cells.len()];
    for (i, c) in cells.iter_mut().enumerate() {
        c.estimate = c.params.estimate(&c.capacity);
        let Some(d) = c.params.dataset().filter(|_| c.dataset == Mode::Reuse) else {
            continue;
        };
        let key = d.plan_key();
        let load = c.estimate.load_seconds;
        let class = c.dataset_class().to_string();
        // The local store `published` lists is not the pods'; theirs start
        // with their volume's snapshot (its loader version is the
        // fingerprint's, which the agent checks).
        let (in_store, snapshotted) = match stores {
            Stores::Shared => {
                let v = published.get(&key).map(|(v, _)| *v);
                (v == Some(d.loader_version), false)
            }
            Stores::PerAgent => {
                let held = held
                    .snapshots
                    .get(&class)
                    .is_some_and(|h| h.contains_key(&key));
                (held, held)
            }
        };
        c.share = Some(Share {
            key: key.clone(),
            builds: false,
            stores,
            published: in_store,
            ready_seconds: 0.0,
            reuses_cluster: false,
            hydrates: false,
            in_place: false,
        });
        if stores == Stores::PerAgent {
            let agents = agents_of(s, &class);
            // Each agent's first `volumes` cells of a held dataset use a
            // volume of their own; its next one hydrates the data root's
            // copy and copies it, later ones copy.
            let volumes = held.cell_volumes.get(&class).copied().unwrap_or(0);
            let n = per_agent.entry((class, key)).or_default();
            *n += 1;
            match c.share.as_mut() {
                Some(share) if snapshotted => {
                    share.in_place = *n <= agents * volumes;
                    share.hydrates = *n <= agents * (volumes + 1);
                }
                _ => builds[i] = *n <= agents,
            }
            continue;
        }
        if in_store {
            continue;
        }
        builders
            .entry(key.clone())
            .and_modify(|b| {
                if load < b.1 {
                    *b = (i, load)
                }
            })
            .or_insert((i, load));
    }
    for b in builders.values() {
        builds[b.0] = true;
    }
    for (i, c) in cells.iter_mut().enumerate() {
        let snapshot = held.snapshots.get(c.dataset_class());
        let (Some(share), Some(d)) = (c.share.as_mut(), c.params.dataset()) else {
            continue;
        };
        let e = &mut c.estimate;
        let snapshot = snapshot.and_then(|h| h.get(&share.key));
        let pgdata = match (published.get(&share.key), snapshot) {
            (_, Some(bytes)) if share.published && stores == Stores::PerAgent => *bytes,
            (Some((_, bytes)), _) if share.published => *bytes,
            _ => d.pgdata_bytes(),
        } as f64;
        let copy = Work::cpu(pgdata / RATE, 2.0);
        if builds[i] {
            let publish = copy.reading(pgdata).seconds(&c.capacity);
            share.builds = true;
            share.ready_seconds = e.load_seconds + publish;
            e.seconds += publish;
            e.publish_seconds = publish;
        } else {
            // The read back stops at what the instance's memory holds.
            let warm = match c.capacity.memory_bytes {
                0 => d.bytes,
                m => d.bytes.min(m),
            } as f64;
            let rewarm = Work::cpu(warm / REWARM, 1.0).reading(warm);
            // Hydration reads the store's copy once, at the device's rate
            // at best (a lazy volume fetches slower: learned estimates
            // correct it once such cells are stored).
            let hydrate = if share.hydrates {
                copy.reading(pgdata).seconds(&c.capacity)
            } else {
                0.0
            };
            // A copy reads the store's copy too where the store is on the
            // class's own volume (a pod's), not the host's disk.
            let restore = match (share.in_place, stores) {
                (true, _) => 0.0,
                (false, Stores::PerAgent) => {
                    copy.reading(pgdata).writing(pgdata).seconds(&c.capacity)
                }
                (false, Stores::Shared) => copy.writing(pgdata).seconds(&c.capacity),
            };
            let (seconds, load) = (e.seconds, e.load_seconds);
            e.load_seconds = hydrate + restore + rewarm.seconds(&c.capacity);
            e.hydrate_seconds = hydrate;
            e.seconds = (seconds - load).max(0.0) + e.load_seconds;
        }
    }
}

/// How many agents the fleet has of `class` (at least one).
fn agents_of(s: &Scenario, class: &str) -> u32 {
    s.fleet
        .value
        .iter()
        .find(|f| f.name.value == class)
        .map_or(1, |f| f.count().max(1))
}

/// The cells of a scenario, estimated as if no dataset were published yet.
pub fn plan(s: &Scenario) -> Vec<PlannedCell> {
    plan_with(s, &Published::new())
}

/// The cells of a scenario, with the datasets already `published` in the
/// store its agents restore from estimated as restores.
pub fn plan_with(s: &Scenario, published: &Published) -> Vec<PlannedCell> {
    plan_for(s, &Holdings::shared(published.clone()))
}

/// The cells of a scenario whose agents' stores hold `held` at its start.
pub fn plan_for(s: &Scenario, held: &Holdings) -> Vec<PlannedCell> {
    let mut cells = Vec::new();
    for (wi, (w, units)) in s.workloads.value.iter().zip(&s.units).enumerate() {
        let classes = s.fleet.value.iter().filter(|f| {
            w.on.as_ref()
                .is_none_or(|on| on.iter().any(|c| c.value == f.name.value))
        });
        let replicas = w.replicas();
        for class in classes {
            let capacity = class.capacity();
            for super::Unit {
                stem,
                params,
                point,
            } in units
            {
                for r in 1..=replicas {
                    let suffix = if replicas > 1 {
                        format!("-r{r}")
                    } else {
                        String::new()
                    };
                    cells.push(PlannedCell {
                        cell_id: format!("w{wi}-{}-{stem}{suffix}", class.name.value),
                        instance_class: class.name.value.clone(),
                        roles: params
                            .roles()
                            .iter()
                            .map(|r| {
                                (
                                    r.to_string(),
                                    super::validate::role_class(w, r, &class.name.value)
                                        .to_string(),
                                )
                            })
                            .collect(),
                        params: params.clone(),
                        settings: class.settings(),
                        dataset: w
                            .data
                            .as_ref()
                            .and_then(|d| pgfleet_proto::dataset::Mode::parse(&d.value))
                            .unwrap_or_default(),
                        reuse_cluster: w.reuse_cluster.as_ref().is_some_and(|r| r.value),
                        estimate: params.estimate(&capacity),
                        point: point.clone(),
                        capacity,
                        share: None,
                        learned: Corrections::default(),
                        learned_fresh: Corrections::default(),
                        model: None,
                        loads_instead: None,
                    });
                }
            }
        }
    }
    reuse_estimates(s, &mut cells, held);
    reused_cluster_estimates(s, &mut cells);
    load_where_restoring_is_slower(&mut cells, held);
    cells
}

/// A restore the model says takes longer than the cell loading its own
/// data does not pay: the cell loads instead (`data: fresh` for it). That
/// happens where a cell generates its data (`load_method: direct` writes
/// the files at the device's speed, where a restore copies them and reads
/// them back), and, with a store per agent (Kubernetes pods without an
/// object store), where the copy shares one budget with its own reads (a
/// pod's gp3 volume holds both the store and the cluster: 125 MiB/s for the
/// read and the write together). A copy load with one store for the fleet
/// restores as asked: the model puts the two within a few percent, and the
/// store outlives the run. Then, with stores per agent, a build none of its
/// class's cells restores would publish a copy for nobody, unless the
/// class's volumes are kept as snapshots for later runs: its builders load
/// too. Restored and loaded cells measure alike (pgbench's rows are
/// determined by the keys), so only the time changes; the plan's text says
/// how many.
fn load_where_restoring_is_slower(cells: &mut [PlannedCell], held: &Holdings) {
    let fresh = |c: &mut PlannedCell, why| {
        c.dataset = pgfleet_proto::dataset::Mode::Fresh;
        c.share = None;
        c.estimate = c.params.estimate(&c.capacity);
        c.loads_instead = Some(why);
    };
    for c in cells.iter_mut() {
        let Some(share) = &c.share else { continue };
        if share.builds || share.reuses_cluster {
            continue;
        }
        let may = held.stores == Stores::PerAgent || generates(&c.params);
        if may && c.estimate.load_seconds > c.params.estimate(&c.capacity).load_seconds {
            fresh(c, LOADS_FASTER);
        }
    }
    if held.stores != Stores::PerAgent {
        return;
    }
    let used: std::collections::BTreeSet<(String, String)> = cells
        .iter()
        .filter_map(|c| {
            let share = c.share.as_ref().filter(|s| !s.builds)?;
            Some((c.dataset_class().to_string(), share.key.clone()))
        })
        .collect();
    for c in cells.iter_mut() {
        let class = c.dataset_class().to_string();
        let Some(share) = c.share.as_ref().filter(|s| s.builds) else {
            continue;
        };
        if !held.snapshotted.contains(&class) && !used.contains(&(class, share.key.clone())) {
            fresh(c, NOBODY_RESTORES);
        }
    }
}

/// How a cell loads pgbench's tables, for the kinds that do.
pub fn load_method(p: &Params) -> Option<LoadMethod> {
    let init = match p {
        Params::PgbenchInit(p) => p,
        Params::Pgbench(p) => &p.init,
        Params::VacuumBloat(p) => &p.init,
        Params::LogicalDrain(p) => &p.init,
        Params::CompressionAnalysis(p) => p.init.as_ref()?,
        _ => return None,
    };
    Some(init.load_method)
}

/// Whether a cell's dataset is generated directly (`load_method: direct`):
/// its files written at the device's speed, not parsed from COPY.
fn generates(p: &Params) -> bool {
    load_method(p) == Some(LoadMethod::Direct)
}

/// Why a `data: reuse` cell loads its own data (`PlannedCell::loads_instead`).
const LOADS_FASTER: &str = "a restore there would take longer than the load";
const NOBODY_RESTORES: &str =
    "they would build a copy no cell restores (a store per agent, gone with the run's volume)";

/// `reuse_cluster`: a class's agents each keep one cluster of a dataset,
/// so past its first `count` cells of that dataset a class's cells reuse
/// one: no restore, the kind's reset (a vacuum: a read of the data) in
/// its place.
fn reused_cluster_estimates(s: &Scenario, cells: &mut [PlannedCell]) {
    use pgfleet_proto::dataset::ESTIMATE_REWARM_BYTES_PER_SECOND as RATE;
    use pgfleet_proto::workload::Work;
    let mut seen: BTreeMap<(String, String), u32> = BTreeMap::new();
    for c in cells.iter_mut().filter(|c| c.reuse_cluster) {
        let (Some(share), Some(d)) = (&mut c.share, c.params.dataset()) else {
            continue;
        };
        let agents = agents_of(s, &c.instance_class);
        let n = seen
            .entry((c.instance_class.clone(), share.key.clone()))
            .or_default();
        *n += 1;
        if *n <= agents {
            continue;
        }
        share.reuses_cluster = true;
        let bytes = d.bytes as f64;
        let reset = Work::cpu(bytes / RATE, 1.0)
            .reading(bytes)
            .seconds(&c.capacity);
        let e = &mut c.estimate;
        e.seconds = (e.seconds - e.load_seconds).max(0.0) + reset;
        e.load_seconds = reset;
        e.hydrate_seconds = 0.0;
    }
}

/// What a plan will take: per cell and in total, and on the fleet's agents
/// (cells of a class run one at a time on each of its agents).
#[derive(Debug, Clone, PartialEq)]
pub struct PlanEstimate {
    /// Sum over cells.
    pub cell_seconds: f64,
    pub measured_seconds: f64,
    /// `cell_seconds` by phase.
    pub phases: Phases,
    /// Wall clock on the fleet: per class, its cells spread over its agents
    /// (longest first), and classes side by side; no less than the emulated
    /// instances' CPU-seconds over this host's cores.
    pub wall_seconds: f64,
    /// The most disk one agent needs at once (its largest cell).
    pub disk_bytes_per_agent: u64,
}

pub fn estimate(s: &Scenario, cells: &[PlannedCell]) -> PlanEstimate {
    estimate_with(s, cells, true)
}

/// `estimate` with every cell loading its own data (no dataset reused).
pub fn estimate_fresh(s: &Scenario, cells: &[PlannedCell]) -> PlanEstimate {
    estimate_with(s, cells, false)
}

/// With datasets `reused`, each dataset's builder goes first and the cells
/// restoring it start no earlier than it is ready; else every cell loads.
fn estimate_with(s: &Scenario, cells: &[PlannedCell], reused: bool) -> PlanEstimate {
    let of = |c: &PlannedCell| {
        if reused {
            c.estimate()
        } else {
            c.fresh_estimate()
        }
    };
    fn share(c: &PlannedCell, reused: bool) -> Option<&Share> {
        c.share.as_ref().filter(|_| reused)
    }
    let mut free: BTreeMap<&str, Vec<f64>> = s
        .fleet
        .value
        .iter()
        .map(|f| {
            (
                f.name.value.as_str(),
                vec![0.0f64; f.count().max(1) as usize],
            )
        })
        .collect();
    let mut ready: BTreeMap<&str, f64> = BTreeMap::new();
    for builders in [true, false] {
        for f in &s.fleet.value {
            let class = f.name.value.as_str();
            // (seconds, agents of this class the cell holds at once, cell)
            let mut mine: Vec<(f64, usize, &PlannedCell)> = cells
                .iter()
                .filter(|c| c.instance_class == class)
                .filter(|c| share(c, reused).is_some_and(|s| s.builds) == builders)
                .map(|c| {
                    let here = c.roles.iter().filter(|(_, k)| k == class).count();
                    (of(c).seconds, here.max(1), c)
                })
                .collect();
            mine.sort_by(|a, b| b.0.total_cmp(&a.0));
            // Longest first onto the least loaded agents; a multi-role cell
            // starts when all the agents it needs are free.
            let Some(agents) = free.get_mut(class) else {
                continue;
            };
            for (secs, k, c) in mine {
                agents.sort_by(|a, b| a.total_cmp(b));
                let k = k.min(agents.len());
                let earliest = share(c, reused)
                    .filter(|s| s.waits())
                    .and_then(|s| ready.get(s.key.as_str()).copied())
                    .unwrap_or(0.0);
                let start = agents[k - 1].max(earliest);
                for a in &mut agents[..k] {
                    *a = start + secs;
                }
                if let Some(s) = share(c, reused).filter(|s| s.builds) {
                    ready.insert(s.key.as_str(), start + s.ready_seconds);
                }
            }
        }
    }
    let mut wall = free.values().flatten().fold(0.0, |a: f64, b| a.max(*b));
    // Emulated instances wait for their host's CPUs (unless the scenario
    // oversubscribes): local agents share this host, so its cores bound how
    // many CPU-seconds of instances run at once.
    if !s.oversubscribe() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        let cpu_seconds: f64 = cells
            .iter()
            .map(|c| {
                let cpus = s
                    .fleet
                    .value
                    .iter()
                    .find(|f| f.name.value == c.instance_class)
                    .map(|f| f.instance())
                    .filter(|i| i.emulate)
                    .map_or(0, |i| i.cpus) as f64;
                of(c).seconds * cpus * c.roles.len().max(1) as f64
            })
            .sum();
        wall = wall.max(cpu_seconds / cores);
    }
    PlanEstimate {
        cell_seconds: cells.iter().map(|c| of(c).seconds).sum(),
        measured_seconds: cells.iter().map(|c| of(c).measured_seconds).sum(),
        phases: Phases::sum(&cells.iter().map(|c| of(c).phases()).collect::<Vec<_>>()),
        wall_seconds: wall,
        disk_bytes_per_agent: cells.iter().map(|c| of(c).disk_bytes).max().unwrap_or(0),
    }
}

/// `pgfleet validate`'s listing: each cell with its estimate, then totals.
pub fn describe(s: &Scenario, cells: &[PlannedCell], path: &std::path::Path) -> String {
    use pgfleet_proto::workload::{approx_bytes, approx_seconds};
    let agents: u32 = s.fleet.value.iter().map(|f| f.count()).sum();
    let w =
        |f: fn(&PlannedCell) -> usize, min: usize| cells.iter().map(f).max().unwrap_or(0).max(min);
    let (wc, wk, wl) = (
        w(|c| c.cell_id.len(), 4),
        w(|c| c.workload().name().len(), 4),
        w(|c| c.instance_class.len(), 5),
    );
    let mut out = format!(
        "{}: valid; {} cell{} on {agents} agent{}:\n  {:<wc$}  {:<wk$}  {:<wl$}  {:>10}  {:>9} {:<8}  {:>9}  {:>9}  {:>9}  {:>9}\n",
        path.display(),
        cells.len(),
        if cells.len() == 1 { "" } else { "s" },
        if agents == 1 { "" } else { "s" },
        "cell",
        "kind",
        "class",
        "takes",
        "data",
        "",
        "prepare",
        "measures",
        "other",
        "disk"
    );
    for c in cells {
        let e = c.estimate();
        let p = e.phases();
        let step = match c.how() {
            "none" if p.data >= 0.5 => "load",
            "none" => "",
            "built" => "build",
            "loaded" => "load",
            "restored" if p.hydrate > 0.0 => "hydrate",
            "restored" => "restore",
            _ => "reset",
        };
        out += &format!(
            "  {:<wc$}  {:<wk$}  {:<wl$}  {:>10}  {:>9} {:<8}  {:>9}  {:>9}  {:>9}  {:>9}{}\n",
            c.cell_id,
            c.workload(),
            c.instance_class,
            approx_seconds(e.seconds),
            approx_seconds(p.data),
            step,
            approx_seconds(p.prepare),
            approx_seconds(p.measure),
            approx_seconds(p.other),
            approx_bytes(e.disk_bytes),
            if c.learned.is_empty() { "" } else { "  *" }
        );
    }
    for (i, sweep) in s.sweeps.iter().enumerate() {
        if sweep.axes.is_empty() {
            continue;
        }
        let mine: Vec<&PlannedCell> = cells
            .iter()
            .filter(|c| c.cell_id.starts_with(&format!("w{i}-")))
            .collect();
        let e = estimate(s, &mine.iter().map(|c| (*c).clone()).collect::<Vec<_>>());
        out += &format!(
            "workloads[{i}] sweeps {sweep}: {} point{}, {} cell{}, {} of cells\n",
            sweep.points(),
            if sweep.points() == 1 { "" } else { "s" },
            mine.len(),
            if mine.len() == 1 { "" } else { "s" },
            approx_seconds(e.cell_seconds)
        );
    }
    for w in warnings(s, cells, host_memory()) {
        out += &w;
        out += "\n";
    }
    let t = estimate(s, cells);
    out += &format!(
        "estimated: {} of cells ({} of it measuring), about {} on this fleet; up to {} of disk per agent\n",
        approx_seconds(t.cell_seconds),
        approx_seconds(t.measured_seconds),
        approx_seconds(t.wall_seconds),
        approx_bytes(t.disk_bytes_per_agent)
    );
    out += &format!("  where the hours go: {}\n", t.phases.shares());
    out += &longest(cells);
    out += &corrected(cells);
    if let Some((currency, prices)) = s.prices() {
        // The fleet's instances are held for the whole run.
        let per_hour: f64 = s
            .fleet
            .value
            .iter()
            .filter_map(|f| Some(prices.get(&f.name.value)?.per_hour() * f.count() as f64))
            .sum();
        out += &format!(
            "at the scenario's prices: about {:.2} {currency} for the priced instances over {} ({:.2} {currency} an hour)\n",
            per_hour * t.wall_seconds / 3600.0,
            approx_seconds(t.wall_seconds),
            per_hour
        );
    }
    let fresh = estimate_fresh(s, cells);
    if fresh != t {
        out += &reuse_line(cells, &fresh);
    }
    for why in [LOADS_FASTER, NOBODY_RESTORES] {
        let of: Vec<&PlannedCell> = cells
            .iter()
            .filter(|c| c.loads_instead == Some(why))
            .collect();
        let classes: std::collections::BTreeSet<&str> =
            of.iter().map(|c| c.instance_class.as_str()).collect();
        if !of.is_empty() {
            out += &format!(
                "  {} cell(s) of {} load their own data: {why}\n",
                of.len(),
                classes.into_iter().collect::<Vec<_>>().join(", ")
            );
        }
    }
    out
}

/// The kinds and classes holding the most of the plan's cell time, with
/// their longest cell: where to look first to make a plan shorter.
fn longest(cells: &[PlannedCell]) -> String {
    use pgfleet_proto::workload::approx_seconds;
    let total: f64 = cells.iter().map(|c| c.estimate().seconds).sum();
    if cells.len() < 3 || total <= 0.0 {
        return String::new();
    }
    let mut groups: BTreeMap<(String, &str), (f64, usize, f64)> = BTreeMap::new();
    for c in cells {
        let s = c.estimate().seconds;
        let g = groups
            .entry((c.workload().name().to_string(), c.instance_class.as_str()))
            .or_default();
        *g = (g.0 + s, g.1 + 1, g.2.max(s));
    }
    let mut groups: Vec<_> = groups.into_iter().collect();
    groups.sort_by(|a, b| b.1.0.total_cmp(&a.1.0));
    let mut out = String::from("  the longest: ");
    out += &groups
        .iter()
        .take(3)
        .map(|((kind, class), (sum, n, max))| {
            let cells = match n {
                1 => format!("1 cell, {}", approx_seconds(*max)),
                n => format!("{n} cells, up to {} each", approx_seconds(*max)),
            };
            format!("{kind} on {class} {:.0} % ({cells})", 100.0 * sum / total)
        })
        .collect::<Vec<_>>()
        .join("; ");
    out + "\n"
}

/// The cells whose estimates earlier cells corrected (`*` in the table),
/// with the corrections and the runs they come from.
fn corrected(cells: &[PlannedCell]) -> String {
    let mut out = String::new();
    for c in cells.iter().filter(|c| !c.learned.is_empty()) {
        let runs = c.learned.runs();
        let more = runs.len().saturating_sub(3);
        out += &format!(
            "  * {}: {} the model, learned from run{} {}{}\n",
            c.cell_id,
            c.learned.describe(),
            if runs.len() == 1 { "" } else { "s" },
            runs.iter().take(3).copied().collect::<Vec<_>>().join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            }
        );
    }
    out
}

/// What reusing datasets saves, under the plan's total: which datasets are
/// built once (or found ready) and restored, against every cell loading its
/// own (`fresh`).
fn reuse_line(cells: &[PlannedCell], fresh: &PlanEstimate) -> String {
    use pgfleet_proto::dataset::Mode;
    use pgfleet_proto::workload::approx_seconds;
    let (mut built, mut ready) = (BTreeMap::new(), BTreeMap::new());
    for c in cells.iter().filter(|c| c.dataset == Mode::Reuse) {
        if let (Some(d), Some(share)) = (c.params.dataset(), &c.share) {
            let to = if share.published {
                &mut ready
            } else {
                &mut built
            };
            to.insert(share.key.clone(), d.label);
        }
    }
    let names = |m: &BTreeMap<String, String>| {
        let v: std::collections::BTreeSet<&str> = m.values().map(String::as_str).collect();
        v.into_iter().collect::<Vec<_>>().join(", ")
    };
    let per_agent = cells.iter().any(|c| {
        c.share
            .as_ref()
            .is_some_and(|s| s.stores == Stores::PerAgent)
    });
    let in_place = cells
        .iter()
        .any(|c| c.share.as_ref().is_some_and(|s| s.in_place));
    let (once, there, then) = if per_agent {
        (
            "built once per agent",
            "already in the snapshots the agents' volumes start from",
            if in_place {
                "hydrated on a volume of the snapshot per cell and used in place"
            } else {
                "hydrated once per agent and restored"
            },
        )
    } else {
        ("built once", "already in the store", "restored")
    };
    let datasets = match (built.is_empty(), ready.is_empty()) {
        (false, true) => format!(
            "{} dataset(s) {once} and restored ({})",
            built.len(),
            names(&built)
        ),
        (true, false) => format!(
            "{} dataset(s) {there}, {then} ({})",
            ready.len(),
            names(&ready)
        ),
        _ => format!(
            "{} dataset(s) {once} and restored ({}), {} {there}, {then} ({})",
            built.len(),
            names(&built),
            ready.len(),
            names(&ready)
        ),
    };
    format!(
        "  with data: reuse, {datasets}: as above; every cell loading its own: {} of cells, about {} on this fleet\n",
        approx_seconds(fresh.cell_seconds),
        approx_seconds(fresh.wall_seconds)
    )
}

/// The seeds' proportion of data to memory (482 GiB on 64 GiB).
pub const SEEDS_DATA_PER_MEMORY: f64 = 7.5;

/// Measurements that cannot show what they claim to:
/// - a storage comparison whose class has capped storage and whose cells'
///   working set fits in the memory its clusters have (the instance's when
///   emulated, else `host_memory`): reads are served from the page cache
///   and only writes meet the cap;
/// - a read from the OS cache (`cached_read_bytes`) of more data than that
///   memory holds: it reads the device, i.e. it is a cold read.
pub fn warnings(s: &Scenario, cells: &[PlannedCell], host_memory: u64) -> Vec<String> {
    use pgfleet_proto::workload::approx_bytes;
    let mut out = Vec::new();
    for f in &s.fleet.value {
        let instance = f.instance();
        let (memory, whose) = if instance.emulate && instance.memory_bytes > 0 {
            (instance.memory_bytes, "the instance's")
        } else {
            (host_memory, "this host's")
        };
        let cached = cells
            .iter()
            .filter(|c| c.instance_class == f.name.value)
            .filter_map(|c| c.params.cached_read_bytes().map(|b| (b, c.params.kind())))
            .max();
        // The page cache gets what the memory holds besides the server's
        // shared buffers and processes: at most about 3/4 of it.
        if let Some((data, kind)) = cached
            && memory > 0
            && data > memory / 4 * 3
        {
            out.push(format!(
                "warning: class `{}`: {kind} reads ~{} \"from the OS cache\", more than {whose} memory ({}) can cache: that read goes to the device and measures a cold read. Give the class `instance: {{memory: {}}}` or more, or fewer rows.",
                f.name.value,
                approx_bytes(data),
                approx_bytes(memory),
                approx_bytes(data / 3 * 4 + (256 << 20)),
            ));
        }
        let caps = f.caps();
        if caps == Default::default() || !f.emulate() {
            continue;
        }
        let largest = cells
            .iter()
            .filter(|c| c.instance_class == f.name.value)
            .filter_map(|c| c.params.working_set_bytes())
            .max();
        if let Some(data) = largest
            && memory > 0
            && data < 2 * memory
        {
            let fit = (data as f64 / SEEDS_DATA_PER_MEMORY) as u64;
            let advice = if fit >= 96 << 20 {
                format!(
                    "give the class `instance: {{memory: {}}}` (1/{SEEDS_DATA_PER_MEMORY} of the data, as in the seeds)",
                    approx_bytes(fit)
                )
            } else {
                format!(
                    "raise the scale to ~{:.0}x this data and give the class `instance: {{memory: 96MiB}}` or more (the seeds: data = {SEEDS_DATA_PER_MEMORY}x memory)",
                    (96u64 << 20) as f64 * SEEDS_DATA_PER_MEMORY / data as f64
                )
            };
            // Up to twice the memory, the OS cache and shared buffers
            // together hold most of it.
            let (fits, reads) = if data <= memory {
                ("fits in", "reads")
            } else {
                ("is less than twice", "most reads")
            };
            out.push(format!(
                "warning: class `{}`: the data read at random (~{}) {fits} {whose} memory ({}): {reads} will be served from memory and only writes meet the storage caps. To compare storage as the seeds did, {advice}.",
                f.name.value,
                approx_bytes(data),
                approx_bytes(memory),
            ));
        }
    }
    out
}

/// This host's memory (`/proc/meminfo`), the memory local agents' clusters
/// have when the instance is not emulated; 0 if unknown.
pub fn host_memory() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const AB: &str = "\
name: ab
fleet:
  - {name: nvme, count: 2}
  - {name: gp3, count: 2, storage: {profile: gp3}}
workloads:
  - {kind: pgbench, scale: 200, script: select-only, duration_s: 10, replicas: 2, load_method: copy}
  - {kind: logical-drain, scale: 10, backlog_bytes: 64MiB, clients: 4, load_method: copy}
";

    fn cell<'a>(cells: &'a [PlannedCell], id: &str) -> &'a PlannedCell {
        cells.iter().find(|c| c.cell_id == id).unwrap()
    }

    /// A direct load (the default) writes each page once at the device's
    /// speed; with a store per agent a restore reads the copy and writes it
    /// on the same device, so the plan generates instead on every class.
    /// With one store for the fleet, a
    /// restore only writes: about the direct load's time, so cells restore
    /// as asked.
    #[test]
    fn plans_generate_where_a_direct_load_beats_a_restore() {
        let per_agent = Holdings::per_agent(BTreeMap::new());
        let text = AB.replace(", load_method: copy", "");
        let s = super::super::parse(std::path::Path::new("ab.yaml"), &text).unwrap();
        let cells = plan_for(&s, &per_agent);
        for c in cells.iter().filter(|c| c.cell_id.starts_with("w0-")) {
            assert_eq!(c.how(), "loaded", "{}: {:?}", c.cell_id, c.estimate());
            assert!(c.loads_instead.is_some(), "{}", c.cell_id);
        }
        let text = describe(&s, &cells, std::path::Path::new("ab.yaml"));
        assert!(text.contains("load their own data"), "{text}");
        let shared = plan(&s);
        assert_eq!(cell(&shared, "w0-nvme-select-only-r2").how(), "restored");
    }

    /// Estimates are the class's: gp3's caps slow its load and its backlog
    /// (the storage suite's 64 MiB backlog took 100 s there and 11 s
    /// uncapped), a restored cell skips the load but pays the copy onto the
    /// class's storage and the read back, and the first cell of a dataset
    /// pays its publishing.
    #[test]
    fn estimates_follow_the_class_and_the_dataset() {
        let s = super::super::parse(std::path::Path::new("ab.yaml"), AB).unwrap();
        let cells = plan(&s);
        let (n1, n2) = (
            cell(&cells, "w0-nvme-select-only-r1"),
            cell(&cells, "w0-nvme-select-only-r2"),
        );
        let (g1, g2) = (
            cell(&cells, "w0-gp3-select-only-r1"),
            cell(&cells, "w0-gp3-select-only-r2"),
        );
        assert!(g2.capacity.caps.write_mbps == 125 && n1.capacity.caps.write_mbps == 0);
        // Both nvme cells are planned first: r1 builds, the others restore.
        assert!(n1.estimate().seconds > n1.fresh_estimate().seconds);
        for c in [n2, g1, g2] {
            assert_eq!(
                c.estimate().measured_seconds,
                c.fresh_estimate().measured_seconds
            );
        }
        // Uncapped, a restore (a parallel copy) beats the load; onto gp3 it
        // is the copy and the read back at 125 MiB/s each, about the load
        // itself (what a snapshot restore would change).
        let (e, fresh) = (n2.estimate(), n2.fresh_estimate());
        assert!(e.load_seconds < 0.5 * fresh.load_seconds, "{e:?} {fresh:?}");
        let (e, fresh) = (g2.estimate(), g2.fresh_estimate());
        assert!(e.load_seconds > 0.8 * fresh.load_seconds, "{e:?} {fresh:?}");
        // Loading and restoring write through gp3's 125 MiB/s.
        assert!(g1.fresh_estimate().seconds > 1.5 * n1.fresh_estimate().seconds);
        assert!(g2.estimate().seconds > 2.0 * n2.estimate().seconds);
        let (dn, dg) = (
            cell(&cells, "w1-nvme-backlog-64MiB").fresh_estimate(),
            cell(&cells, "w1-gp3-backlog-64MiB").fresh_estimate(),
        );
        // The drain's backlog (a few thousand UPDATEs, page images mostly:
        // BENCHMARKS.md "Estimates: the logical drain") and its sync write
        // through gp3's budget.
        assert!(dg.seconds > 1.3 * dn.seconds, "{dn:?} {dg:?}");
        // An instance's CPUs bound CPU-bound work (a partitioned load).
        let load = |cpus: u32| {
            let text = format!(
                "name: l\nfleet: [{{name: a, instance: {{cpus: {cpus}, emulate: false}}}}]\n\
                 workloads: [{{kind: pgbench-init, scale: 100, partitions: 4, load_method: copy}}]\n"
            );
            let s = super::super::parse(std::path::Path::new("l.yaml"), &text).unwrap();
            plan(&s)[0].estimate().seconds
        };
        assert!(load(1) > 1.5 * load(4) - 2.0, "{} {}", load(1), load(4));
    }

    /// A dataset is built by the class that loads it fastest, wherever the
    /// fleet lists it, and the plan's wall clock has the cells restoring it
    /// start once it is published.
    #[test]
    fn a_dataset_is_built_on_the_class_that_loads_it_fastest() {
        let text = AB.replace(
            "  - {name: nvme, count: 2}\n  - {name: gp3, count: 2, storage: {profile: gp3}}\n",
            "  - {name: gp3, count: 2, storage: {profile: gp3}}\n  - {name: nvme, count: 2}\n",
        );
        assert_ne!(text, AB);
        let s = super::super::parse(std::path::Path::new("ab.yaml"), &text).unwrap();
        let cells = plan(&s);
        // pgbench's cells (the drain's scale is another dataset).
        let pgbench = || cells.iter().filter(|c| c.cell_id.starts_with("w0-"));
        let shared: Vec<(&str, bool)> = pgbench()
            .filter_map(|c| Some((c.cell_id.as_str(), c.share.as_ref()?.builds)))
            .collect();
        assert_eq!(
            shared,
            [
                ("w0-gp3-select-only-r1", false),
                ("w0-gp3-select-only-r2", false),
                ("w0-nvme-select-only-r1", true),
                ("w0-nvme-select-only-r2", false),
            ]
        );
        let keys: std::collections::BTreeSet<&str> = pgbench()
            .filter_map(|c| Some(c.share.as_ref()?.key.as_str()))
            .collect();
        assert_eq!(keys.len(), 1, "{keys:?}");
        let n1 = cell(&cells, "w0-nvme-select-only-r1");
        let ready = n1.share.as_ref().unwrap().ready_seconds;
        assert!(ready > n1.estimate().load_seconds, "{ready} {n1:?}");
        // gp3 restores; its cells start when nvme's build is published.
        let g1 = cell(&cells, "w0-gp3-select-only-r1").estimate();
        assert!(g1.load_seconds < g1.seconds);
        let wall = estimate(&s, &cells).wall_seconds;
        assert!(wall >= ready + g1.seconds, "{wall} {ready} {g1:?}");
    }

    /// A store per agent (Kubernetes pods without an object store): each
    /// agent's first cell of a dataset builds it (a class's first `count`
    /// cells), its later cells restore it, no cell waits for another
    /// agent's build, and the local store's datasets are not the pods'.
    #[test]
    fn with_a_store_per_agent_each_agent_builds_its_first_and_nothing_waits() {
        let text = AB.replace("replicas: 2", "replicas: 3");
        let s = super::super::parse(std::path::Path::new("ab.yaml"), &text).unwrap();
        // Volumes kept as snapshots: every build serves later runs.
        let kept = Holdings {
            snapshotted: ["nvme", "gp3"].map(String::from).into(),
            ..Holdings::per_agent(BTreeMap::new())
        };
        let cells = plan_for(&s, &kept);
        let steps: Vec<(&str, &str)> = cells
            .iter()
            .map(|c| (c.cell_id.as_str(), c.how()))
            .collect();
        assert_eq!(
            steps,
            [
                ("w0-nvme-select-only-r1", "built"),
                ("w0-nvme-select-only-r2", "built"),
                ("w0-nvme-select-only-r3", "restored"),
                ("w0-gp3-select-only-r1", "built"),
                ("w0-gp3-select-only-r2", "built"),
                // A copy on gp3 reads and writes through one 125 MiB/s:
                // slower than loading at that scale.
                ("w0-gp3-select-only-r3", "loaded"),
                ("w1-nvme-backlog-64MiB", "built"),
                ("w1-gp3-backlog-64MiB", "built"),
            ]
        );
        let g3 = cell(&cells, "w0-gp3-select-only-r3");
        assert_eq!(g3.loads_instead, Some(LOADS_FASTER));
        assert_eq!(
            g3.dataset,
            pgfleet_proto::dataset::Mode::Fresh,
            "the agent is told to load"
        );
        assert!(
            cells
                .iter()
                .all(|c| c.share.as_ref().is_none_or(|s| !s.waits()))
        );
        // Volumes that go with the run: a build that no cell of its class
        // restores publishes for nobody, so it loads (gp3's, the drains').
        let gone = plan_for(&s, &Holdings::per_agent(BTreeMap::new()));
        let steps: Vec<(&str, &str)> = gone.iter().map(|c| (c.cell_id.as_str(), c.how())).collect();
        assert_eq!(
            steps,
            [
                ("w0-nvme-select-only-r1", "built"),
                ("w0-nvme-select-only-r2", "built"),
                ("w0-nvme-select-only-r3", "restored"),
                ("w0-gp3-select-only-r1", "loaded"),
                ("w0-gp3-select-only-r2", "loaded"),
                ("w0-gp3-select-only-r3", "loaded"),
                ("w1-nvme-backlog-64MiB", "loaded"),
                ("w1-gp3-backlog-64MiB", "loaded"),
            ]
        );
        assert_eq!(
            cell(&gone, "w1-nvme-backlog-64MiB").loads_instead,
            Some(NOBODY_RESTORES)
        );
        let text = describe(&s, &gone, std::path::Path::new("ab.yaml"));
        assert!(
            text.contains("1 cell(s) of gp3 load their own data: a restore there would take longer than the load")
                && text.contains("4 cell(s) of gp3, nvme load their own data: they would build a copy no cell restores"),
            "{text}"
        );
        // gp3 builds its own at its cap instead of waiting for nvme's.
        let g1 = cell(&cells, "w0-gp3-select-only-r1");
        assert!(g1.estimate().seconds > g1.fresh_estimate().seconds);
        let shared = plan(&s);
        assert!(
            cell(&shared, "w0-gp3-select-only-r1")
                .share
                .as_ref()
                .unwrap()
                .waits()
        );
        // The local store's datasets do not reach the pods.
        let d = cells[0].params.dataset().unwrap();
        let published = Published::from([(d.plan_key(), (d.loader_version, d.pgdata_bytes()))]);
        let held = Holdings {
            published,
            ..kept.clone()
        };
        assert_eq!(plan_for(&s, &held), cells);
        let text = describe(&s, &cells, std::path::Path::new("ab.yaml"));
        assert!(text.contains("built once per agent and restored"), "{text}");
    }

    /// Pods whose volumes come from a dataset snapshot holding a dataset
    /// (Kubernetes, `--dataset-snapshots`), no volume per cell: none of
    /// their class's cells builds it, each agent's first reads it in full
    /// (hydration) and then restores it, the later ones restore it; the
    /// other class and the drain are planned as without the snapshot.
    #[test]
    fn volumes_made_from_a_dataset_snapshot_hydrate_then_restore() {
        let text = AB.replace("replicas: 2", "replicas: 3");
        let s = super::super::parse(std::path::Path::new("ab.yaml"), &text).unwrap();
        let kept = Holdings {
            snapshotted: ["nvme", "gp3"].map(String::from).into(),
            ..Holdings::per_agent(BTreeMap::new())
        };
        let empty = plan_for(&s, &kept);
        let d = empty[0].params.dataset().unwrap();
        let bytes = d.pgdata_bytes();
        let held = Holdings {
            snapshots: BTreeMap::from([(
                "nvme".to_string(),
                BTreeMap::from([(d.plan_key(), bytes)]),
            )]),
            ..kept.clone()
        };
        let cells = plan_for(&s, &held);
        let steps: Vec<(&str, &str, bool)> = cells
            .iter()
            .filter(|c| c.cell_id.starts_with("w0-nvme"))
            .map(|c| {
                let share = c.share.as_ref().unwrap();
                (c.cell_id.as_str(), c.how(), share.hydrates)
            })
            .collect();
        assert_eq!(
            steps,
            [
                ("w0-nvme-select-only-r1", "restored", true),
                ("w0-nvme-select-only-r2", "restored", true),
                ("w0-nvme-select-only-r3", "restored", false),
            ]
        );
        for (a, b) in cells.iter().zip(&empty) {
            if a.instance_class == "gp3" || a.cell_id.starts_with("w1-") {
                assert_eq!(a, b);
            }
        }
        let (n1, n3) = (
            cell(&cells, "w0-nvme-select-only-r1"),
            cell(&cells, "w0-nvme-select-only-r3"),
        );
        // On each agent's first, a read of the dataset before the restore.
        use pgfleet_proto::workload::Work;
        let read = Work::cpu(
            bytes as f64 / pgfleet_proto::dataset::ESTIMATE_COPY_BYTES_PER_SECOND,
            2.0,
        )
        .reading(bytes as f64)
        .seconds(&n1.capacity);
        let hydration = n1.estimate().load_seconds - n3.estimate().load_seconds;
        assert!(
            (hydration - read).abs() < read * 0.05 && read > 0.0,
            "{hydration} s for {bytes} bytes"
        );
        assert!((n1.estimate().hydrate_seconds - hydration).abs() < 1e-9);
        assert_eq!(n3.estimate().hydrate_seconds, 0.0);
        let text = describe(&s, &cells, std::path::Path::new("ab.yaml"));
        assert!(
            text.contains(
                "1 already in the snapshots the agents' volumes start from, hydrated once per agent and restored (pgbench-s200)"
            ),
            "{text}"
        );
        let row = |id: &str| text.lines().find(|l| l.contains(id)).unwrap().to_string();
        assert!(
            row("w0-nvme-select-only-r1").contains(" hydrate "),
            "{text}"
        );
        assert!(
            row("w0-nvme-select-only-r3").contains(" restore "),
            "{text}"
        );
        assert!(
            text.contains("where the hours go: data movement "),
            "{text}"
        );
        assert!(text.contains(" (of it hydrate "), "{text}");
    }

    /// Each cell's estimate is split into phases that add up to it: the
    /// data movement (a build's load and publish, a restore), the kind's
    /// preparation (a drain's sync and backlog), the timed measurement and
    /// the rest; `validate` shows them per cell and the run's shares.
    #[test]
    fn a_plan_says_where_the_hours_go() {
        let s = super::super::parse(std::path::Path::new("ab.yaml"), AB).unwrap();
        let cells = plan(&s);
        for c in &cells {
            let (e, p) = (c.estimate(), c.estimate().phases());
            assert!(
                (p.total() - e.seconds).abs() < 1e-6,
                "{}: {p:?} {e:?}",
                c.cell_id
            );
        }
        let built = cells.iter().find(|c| c.how() == "built").unwrap();
        let p = built.estimate().phases();
        assert!(p.publish > 0.0 && p.data > p.publish, "{p:?}");
        assert_eq!(p.measure, 10.0);
        let drain = cell(&cells, "w1-gp3-backlog-64MiB");
        let p = drain.estimate().phases();
        assert!(
            p.prepare > p.measure && p.other > 0.0,
            "sync and backlog; the checksum: {p:?}"
        );
        let t = estimate(&s, &cells);
        assert!((t.phases.total() - t.cell_seconds).abs() < 1e-6);
        let text = describe(&s, &cells, std::path::Path::new("ab.yaml"));
        let header = text.lines().nth(1).unwrap();
        for col in ["takes", "data", "prepare", "measures", "other", "disk"] {
            assert!(header.contains(col), "{header}");
        }
        let shares = text
            .lines()
            .find(|l| l.contains("where the hours go: "))
            .unwrap();
        let sum: f64 = shares
            .split(" %")
            .filter_map(|x| x.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        // data + prepare + measure + rest (publish is within data).
        let publish = 100.0 * t.phases.publish / t.phases.total();
        assert!((sum - publish.round() - 100.0).abs() <= 2.0, "{shares}");
        assert!(
            text.contains("the longest: pgbench on gp3 58 % (2 cells, up to 67 s each); "),
            "{text}"
        );
        assert!(
            text.contains("logical-drain on gp3 8 % (1 cell, 19 s)"),
            "{text}"
        );
    }

    /// Volumes of the snapshot for one cell each (Kubernetes): the plan
    /// counts the restores an agent of a class makes (what the source
    /// gives each pod), and a cell with a volume of its own hydrates it
    /// and uses it in place, no copy; past them, an agent's next cell
    /// hydrates its data volume's copy and copies it.
    #[test]
    fn cells_with_a_volume_of_their_own_hydrate_it_and_copy_nothing() {
        // A pod's gp3 volume (not emulated), on a node of 1 GiB.
        let text = AB.replace("replicas: 2", "replicas: 3").replace(
            "storage: {profile: gp3}}",
            "storage: {profile: gp3, emulate: false}, instance: {memory: 1GiB, emulate: false}}",
        );
        let s = super::super::parse(std::path::Path::new("ab.yaml"), &text).unwrap();
        let d = plan(&s)[0].params.dataset().unwrap().clone();
        let bytes = d.pgdata_bytes();
        let snapshots =
            BTreeMap::from([("gp3".to_string(), BTreeMap::from([(d.plan_key(), bytes)]))]);
        let mut held = Holdings::per_agent(snapshots);
        // Three gp3 cells restore the snapshot's dataset on two agents.
        assert_eq!(
            restores_per_agent(&s, &held),
            BTreeMap::from([("gp3".to_string(), 2)])
        );
        held.cell_volumes = BTreeMap::from([("gp3".to_string(), 1)]);
        let cells = plan_for(&s, &held);
        // (cell, how, (in place, hydrates))
        type Step<'a> = (&'a str, &'a str, Option<(bool, bool)>);
        let steps: Vec<Step> = cells
            .iter()
            .filter(|c| c.cell_id.starts_with("w0-gp3"))
            .map(|c| {
                let share = c.share.as_ref().map(|s| (s.in_place, s.hydrates));
                (c.cell_id.as_str(), c.how(), share)
            })
            .collect();
        // Past the volumes a copy would read and write every byte through
        // gp3's one 125 MiB/s after hydrating: slower than a load.
        assert_eq!(
            steps,
            [
                ("w0-gp3-select-only-r1", "restored", Some((true, true))),
                ("w0-gp3-select-only-r2", "restored", Some((true, true))),
                ("w0-gp3-select-only-r3", "loaded", None),
            ]
        );
        // In place: the hydration's read of the dataset and the read back
        // of what the node's memory holds, both at gp3's 125 MiB/s, and no
        // copy.
        let g1 = cell(&cells, "w0-gp3-select-only-r1");
        let at_cap = (bytes as f64 + (1u64 << 30) as f64) / (125.0 * 1024.0 * 1024.0);
        let took = g1.estimate().load_seconds;
        assert!(
            (took - at_cap).abs() < at_cap * 0.1,
            "{took} s for {bytes} bytes"
        );
        assert!(
            took < g1.fresh_estimate().load_seconds,
            "faster than a load"
        );
        let text = describe(&s, &cells, std::path::Path::new("ab.yaml"));
        assert!(
            text.contains("hydrated on a volume of the snapshot per cell and used in place"),
            "{text}"
        );
        // Without a snapshot nothing restores from one.
        assert!(restores_per_agent(&s, &Holdings::per_agent(BTreeMap::new())).is_empty());
    }

    /// `reuse_cluster`: past a class's first cell per agent, a dataset's
    /// cells reuse a kept cluster: estimated without a restore.
    #[test]
    fn cells_reusing_a_kept_cluster_are_estimated_without_a_restore() {
        let text = |reuse: bool| {
            format!(
                "name: r\nfleet:\n  - {{name: a, count: 2}}\nworkloads:\n  - {{kind: pgbench, scale: 50, duration_s: 10, replicas: 4, reuse_cluster: {reuse}}}\n"
            )
        };
        let plan_of = |reuse| {
            let s = super::super::parse(std::path::Path::new("r.yaml"), &text(reuse)).unwrap();
            plan(&s)
        };
        let (no, yes) = (plan_of(false), plan_of(true));
        let load = |cells: &[PlannedCell]| -> Vec<f64> {
            cells.iter().map(|c| c.estimate().load_seconds).collect()
        };
        let (no, yes) = (load(&no), load(&yes));
        assert_eq!(no[..2], yes[..2], "one per agent restores (or builds)");
        assert!(yes[2] < no[2] && yes[3] < no[3], "{yes:?} {no:?}");
        assert!(yes[2] > 0.0, "the reset is not free: {yes:?}");
    }

    /// A dataset the store already holds has no builder: every cell
    /// restores it (at the published size) and none waits; another loader
    /// version of it is not that dataset.
    #[test]
    fn a_published_dataset_is_restored_by_every_cell() {
        let s = super::super::parse(std::path::Path::new("ab.yaml"), AB).unwrap();
        let built = plan(&s);
        let d = built[0].params.dataset().unwrap();
        let key = d.plan_key();
        let bytes = d.pgdata_bytes();
        let published = Published::from([(key.clone(), (d.loader_version, bytes))]);
        let cells = plan_with(&s, &published);
        let shared: Vec<&Share> = cells
            .iter()
            .filter(|c| c.cell_id.starts_with("w0-"))
            .filter_map(|c| c.share.as_ref())
            .collect();
        assert_eq!(shared.len(), 4);
        assert!(
            shared.iter().all(|s| s.published && !s.builds),
            "{shared:?}"
        );
        // nvme-r1 restores what it would have built: less time, no publish.
        let (b, r) = (
            cell(&built, "w0-nvme-select-only-r1").estimate(),
            cell(&cells, "w0-nvme-select-only-r1").estimate(),
        );
        assert!(r.seconds < b.seconds, "{r:?} {b:?}");
        // No build, no publish: less of cells, and no later.
        let (wb, wr) = (estimate(&s, &built), estimate(&s, &cells));
        assert!(wr.cell_seconds < wb.cell_seconds, "{wr:?} {wb:?}");
        assert!(wr.wall_seconds <= wb.wall_seconds, "{wr:?} {wb:?}");
        // The published size is what is copied.
        let bigger = Published::from([(key.clone(), (d.loader_version, bytes * 3 / 2))]);
        let g = |p: &Published| cell(&plan_with(&s, p), "w0-gp3-select-only-r1").estimate();
        assert!(g(&bigger).load_seconds > g(&published).load_seconds);
        let other = Published::from([(key, (d.loader_version + 1, bytes))]);
        assert_eq!(plan_with(&s, &other), built);
        let text = describe(&s, &cells, std::path::Path::new("ab.yaml"));
        assert!(
            text.contains("1 already in the store, restored (pgbench-s200)"),
            "{text}"
        );
    }
}
