//! What a cell's cluster ran on, as its agent saw it: the `environment` of
//! a cell (a multi-role cell's is one per role), sent with its result and
//! read by the controller's report and fairness guards. One type for both
//! sides, so a field the report compares is a field the agent fills.
//!
//! Every field has a default: environments stored by earlier versions (and
//! a class known only from its agents' registrations) still read.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Environment {
    pub postgres: Postgres,
    pub storage: Storage,
    pub instance: Instance,
    pub host: Host,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub roles: Option<Roles>,
    /// Where the cell's data came from (the agent's dataset provenance).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dataset: Option<Json>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Postgres {
    /// `SHOW server_version` (e.g. `15.18 (Debian 15.18-0+deb12u1)`).
    pub version: String,
    /// The settings that matter, as the server reports them.
    pub settings: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bin_dir: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// What the build was configured with of what the experiments use
    /// (`lz4`, `zstd`, `liburing`; from `pg_config --configure`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub build: Vec<String>,
}

/// The build options `Postgres::build` reports, of a `pg_config
/// --configure` text.
pub fn build_options(configure: &str) -> Vec<String> {
    ["lz4", "zstd", "liburing"]
        .iter()
        .filter(|f| {
            configure
                .split(|c: char| c.is_whitespace() || c == '\'')
                .any(|w| w == format!("--with-{f}"))
        })
        .map(|f| f.to_string())
        .collect()
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Storage {
    pub profile: String,
    /// The profile's caps are enforced on this host (block-I/O cgroup).
    pub emulated: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_root: Option<String>,
    pub caps: Caps,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
    /// Or the cluster's own device (`major:minor`) the caps hold on for
    /// every writer, the kernel's writeback included (cgroup v1 as root).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// What a short fio probe in the cluster's cgroups got against each cap.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delivered: Option<Delivered>,
}

/// An emulated profile's caps; 0 is uncapped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Caps {
    pub read_iops: u64,
    pub write_iops: u64,
    pub read_mbps: u64,
    pub write_mbps: u64,
    /// Reads and writes share one budget (EBS: gp3's 3,000 IOPS and
    /// 125 MiB/s are of reads and writes together): each cap is then the
    /// budget, which the agent splits between them by demand.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub combined: bool,
    /// What each I/O takes to answer, budget aside (a network volume's
    /// round trip); zero: the host's device as it is.
    #[serde(skip_serializing_if = "Latency::is_zero")]
    pub latency: Latency,
}

/// A storage profile's per-I/O latency, in microseconds: the mean an I/O
/// takes from issue to answer when the volume's budget is not binding.
/// Emulated (agent/src/cluster/ebs.rs) by a volume served from the agent:
/// each I/O answers after its start (when the budget allows it) plus this.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Latency {
    pub read_us: u32,
    pub write_us: u32,
    /// A cache flush (what an fsync asks of the device after its writes).
    pub flush_us: u32,
}

impl Latency {
    /// None added: the host's device as it is.
    pub const NONE: Latency = Latency {
        read_us: 0,
        write_us: 0,
        flush_us: 0,
    };

    pub fn is_zero(&self) -> bool {
        *self == Latency::default()
    }

    /// (probe, the profile's milliseconds, what it times), in a fixed
    /// order: what the storage probe measures at queue depth 1 (an fsync's
    /// write and flush together). Empty without latency.
    pub fn each(&self) -> Vec<(&'static str, f64, &'static str)> {
        if self.is_zero() {
            return Vec::new();
        }
        let ms = |us: u32| f64::from(us) / 1000.0;
        vec![
            ("read_latency_ms", ms(self.read_us), "an 8 KiB read"),
            ("write_latency_ms", ms(self.write_us), "an 8 KiB write"),
            (
                "fdatasync_latency_ms",
                ms(self.write_us) + ms(self.flush_us),
                "a WAL-like write and fdatasync",
            ),
        ]
    }
}

impl Caps {
    pub fn is_capped(&self) -> bool {
        self.each().iter().any(|(_, v, _)| *v > 0)
    }

    /// (cap, its value, the unit a report names it in), in a fixed order.
    pub fn each(&self) -> [(&'static str, u64, &'static str); 4] {
        [
            ("read_iops", self.read_iops, "read IOPS"),
            ("write_iops", self.write_iops, "write IOPS"),
            ("read_mbps", self.read_mbps, "MiB/s of reads"),
            ("write_mbps", self.write_mbps, "MiB/s of writes"),
        ]
    }
}

/// The storage probe's outcome: per cap asked, what fio got (IOPS or MiB/s);
/// `error` when fio could not run (the profile was not checked).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Delivered {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seconds: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fio: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_iops: Option<Probe>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub write_iops: Option<Probe>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_mbps: Option<Probe>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub write_mbps: Option<Probe>,
    /// Mean milliseconds at queue depth 1, where the profile has latency
    /// (`Latency::each`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_latency_ms: Option<Probe>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub write_latency_ms: Option<Probe>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fdatasync_latency_ms: Option<Probe>,
}

impl Delivered {
    /// The probe of one cap by its name (`Caps::each`).
    pub fn of(&self, cap: &str) -> Option<&Probe> {
        match cap {
            "read_iops" => self.read_iops.as_ref(),
            "write_iops" => self.write_iops.as_ref(),
            "read_mbps" => self.read_mbps.as_ref(),
            "write_mbps" => self.write_mbps.as_ref(),
            "read_latency_ms" => self.read_latency_ms.as_ref(),
            "write_latency_ms" => self.write_latency_ms.as_ref(),
            "fdatasync_latency_ms" => self.fdatasync_latency_ms.as_ref(),
            _ => None,
        }
    }

    pub fn set(&mut self, cap: &str, probe: Probe) {
        let slot = match cap {
            "read_iops" => &mut self.read_iops,
            "write_iops" => &mut self.write_iops,
            "read_mbps" => &mut self.read_mbps,
            "write_mbps" => &mut self.write_mbps,
            "read_latency_ms" => &mut self.read_latency_ms,
            "write_latency_ms" => &mut self.write_latency_ms,
            "fdatasync_latency_ms" => &mut self.fdatasync_latency_ms,
            _ => return,
        };
        *slot = Some(probe);
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Probe {
    pub asked: f64,
    pub delivered: f64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Instance {
    /// The emulated instance type (e.g. `m6id.large`), or empty.
    #[serde(rename = "type")]
    pub instance_type: String,
    pub memory_bytes: u64,
    pub cpus: u32,
    /// Memory and CPUs are held to the instance's by cgroups.
    pub emulated: bool,
    pub cgroups: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Host {
    pub hostname: String,
    pub cores: u64,
    pub memory_bytes: u64,
}

impl Environment {
    /// The memory the cluster had: the emulated instance's, else the host's.
    pub fn memory_bytes(&self) -> u64 {
        if self.instance.emulated && self.instance.memory_bytes > 0 {
            self.instance.memory_bytes
        } else {
            self.host.memory_bytes
        }
    }

    /// The CPUs the cluster had: the emulated instance's, else the host's.
    pub fn cpus(&self) -> u64 {
        if self.instance.emulated && self.instance.cpus > 0 {
            u64::from(self.instance.cpus)
        } else {
            self.host.cores
        }
    }
}

/// Who ran what on the cluster.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Roles {
    /// The role scenario SQL runs as.
    pub scenario_sql: String,
    /// Whether that role is a superuser (only with `allow_shell`).
    pub scenario_sql_superuser: bool,
    /// The role the agent's own steps run as.
    pub agent_steps: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_the_agent_sends_and_older_partial_ones() {
        let e = Environment {
            postgres: Postgres {
                version: "15.18".into(),
                settings: [("shared_buffers".to_string(), "128MB".to_string())].into(),
                bin_dir: None,
                port: Some(5432),
                build: build_options(
                    "'--with-lz4' '--with-zstd' '--with-liburing' '--with-lz4-extra'",
                ),
            },
            instance: Instance {
                memory_bytes: 1 << 30,
                cpus: 1,
                emulated: true,
                ..Default::default()
            },
            host: Host {
                cores: 2,
                memory_bytes: 24 << 30,
                ..Default::default()
            },
            ..Default::default()
        };
        let json = serde_json::to_value(&e).unwrap();
        assert_eq!(json["instance"]["type"], "");
        assert_eq!(
            json["postgres"]["build"],
            serde_json::json!(["lz4", "zstd", "liburing"])
        );
        assert_eq!(serde_json::from_value::<Environment>(json).unwrap(), e);
        assert_eq!((e.memory_bytes(), e.cpus()), (1 << 30, 1));
        let old: Environment =
            serde_json::from_str(r#"{"postgres": {"version": "15"}, "host": {"cores": 4}}"#)
                .unwrap();
        assert_eq!((old.postgres.version.as_str(), old.cpus()), ("15", 4));
        assert!(old.postgres.build.is_empty());
    }
}
