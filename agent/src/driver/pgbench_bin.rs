//! `driver: pgbench`: the same script run by the real `pgbench` binary, its
//! per-transaction log (`-l`) turned into the driver's result, so every
//! figure can be cross-checked against the standard tool.
//!
//! Log lines (PostgreSQL 15): `client_id transaction_no time script_no
//! time_epoch time_us [schedule_lag] [retries]`, `time` being the latency in
//! microseconds, or `skipped`, `failed`, `serialization`, `deadlock`.
//! `retries` is summed into the result's retries. pgbench has no warm-up: it runs warm-up + duration and transactions
//! started in the first `warmup` seconds are left out, as the built-in
//! driver does.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use hdrhistogram::Histogram;

use super::{DriverConfig, DriverError, DriverResult, SecondStat};
use crate::pgbin::PgBin;
use crate::sandbox::Sandbox;

pub async fn run(
    cfg: &DriverConfig,
    script_text: &str,
    pg: &PgBin,
    conninfo: &str,
    password: Option<&str>,
    sandbox: &Sandbox,
    cancel: &tokio_util::sync::CancellationToken,
) -> Result<DriverResult, DriverError> {
    let e = |m: String| DriverError(m);
    // pgbench reads the scenario's script: it runs in the sandbox, always
    // (with `\shell` allowed or not), its files in the sandbox's /tmp.
    let script = sandbox
        .put("pgbench-script.sql", script_text)
        .map_err(|x| e(format!("writing the script: {x}")))?;
    let prefix = sandbox.inside("pgbench_log");
    let mut cmd = sandbox
        .command(&pg.tool("pgbench"))
        .map_err(|x| e(x.to_string()))?;
    let mode = pgfleet_proto::workload::pgbench::pgbench_query_mode(script_text);
    cmd.args(["-n", "-M", mode])
        .arg(format!("--client={}", cfg.clients.max(1)))
        .arg(format!(
            "--jobs={}",
            cfg.threads.clamp(1, cfg.clients.max(1))
        ))
        .arg(format!("--file={}", script.display()))
        .arg(format!("--random-seed={}", cfg.seed))
        .arg("--log")
        .arg(format!("--log-prefix={}", prefix.display()));
    match (cfg.duration, cfg.transactions) {
        (Some(d), _) => {
            let total = (cfg.warmup + d).as_secs_f64();
            if total.fract() != 0.0 {
                return Err(e(format!(
                    "pgbench runs whole seconds (-T): duration + warm-up is {total} s"
                )));
            }
            cmd.arg(format!("--time={}", total as u64))
        }
        (None, Some(n)) => cmd.arg(format!("--transactions={n}")),
        (None, None) => return Err(e("give duration_s or transactions".into())),
    };
    for (k, v) in &cfg.vars {
        cmd.arg(format!("--define={k}={v}"));
    }
    if let Some(r) = cfg.rate {
        cmd.arg(format!("--rate={r}"));
    }
    if let Some(l) = cfg.latency_limit {
        cmd.arg(format!("--latency-limit={}", l.as_secs_f64() * 1000.0));
    }
    if pg.major >= 15 {
        cmd.arg(format!("--max-tries={}", cfg.max_tries.max(1)))
            .arg("--failures-detailed");
    }
    // The password through the environment: /proc/PID/environ is private to
    // the process, its command line is not.
    if let Some(p) = password {
        cmd.env("PGPASSWORD", p);
    }
    cmd.arg(conninfo);
    // Its results are its logs; of its own output only the errors are
    // read, and at most `MAX_STDERR_BYTES` of them (`\shell` commands
    // write where pgbench does).
    cmd.stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let run = async {
        let mut child = cmd.spawn()?;
        let mut stderr = Vec::new();
        if let Some(err) = child.stderr.take() {
            use tokio::io::AsyncReadExt;
            let mut err = err.take(MAX_STDERR_BYTES);
            err.read_to_end(&mut stderr).await?;
            // The rest is drained unread, so pgbench never blocks on it.
            let mut rest = err.into_inner();
            let _ = tokio::io::copy(&mut rest, &mut tokio::io::sink()).await;
        }
        Ok::<_, std::io::Error>((child.wait().await?, stderr))
    };
    let (status, stderr) = tokio::select! {
        o = run => o.map_err(|x| e(format!("running {}: {x}", pg.tool("pgbench").display())))?,
        _ = cancel.cancelled() => return Err(e("cancelled".into())),
    };
    if !status.success() {
        return Err(e(format!(
            "pgbench failed ({status}): {}",
            String::from_utf8_lossy(&stderr).trim()
        )));
    }
    let mut text = String::new();
    for entry in std::fs::read_dir(sandbox.tmp())
        .map_err(|x| e(x.to_string()))?
        .flatten()
    {
        if entry
            .file_name()
            .to_string_lossy()
            .starts_with("pgbench_log")
        {
            text += &read_no_follow(&entry.path()).map_err(|x| e(x.to_string()))?;
        }
    }
    // pgbench logs `schedule_lag` with --rate, then `retries` unless
    // --max-tries is 1.
    let retries_field = (pg.major >= 15 && cfg.max_tries.max(1) != 1)
        .then_some(6 + usize::from(cfg.rate.is_some()));
    parse_log(
        &text,
        cfg.warmup,
        cfg.duration,
        cfg.latency_limit,
        retries_field,
    )
}

/// The most of pgbench's error output kept.
const MAX_STDERR_BYTES: u64 = 64 << 10;

/// The most of pgbench's logs the agent reads (a transaction is a line
/// of ~40 bytes: tens of millions of transactions).
pub const MAX_LOG_BYTES: u64 = 2 << 30;

/// A file the sandbox wrote: never through a symlink it may have planted,
/// never a FIFO or device (opened without blocking, then checked to be a
/// regular file), never more than `MAX_LOG_BYTES`.
fn read_no_follow(p: &Path) -> std::io::Result<String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(p)?;
    let m = f.metadata()?;
    if !m.is_file() {
        return Err(std::io::Error::other(format!(
            "{} is not a regular file: the sandbox made it, not pgbench",
            p.display()
        )));
    }
    if m.len() > MAX_LOG_BYTES {
        return Err(std::io::Error::other(format!(
            "{} is {} bytes: more than the {MAX_LOG_BYTES} read of pgbench's logs (a shorter run, or driver: pgfleet)",
            p.display(),
            m.len()
        )));
    }
    let mut text = String::new();
    f.take(MAX_LOG_BYTES).read_to_string(&mut text)?;
    Ok(text)
}

/// Turns pgbench's per-transaction log into the driver's result.
pub fn parse_log(
    text: &str,
    warmup: Duration,
    duration: Option<Duration>,
    latency_limit: Option<Duration>,
    retries_field: Option<usize>,
) -> Result<DriverResult, DriverError> {
    struct Line {
        latency_us: Option<u64>,
        outcome: String,
        end_us: u64,
        retries: u64,
    }
    let mut lines = Vec::new();
    for (i, l) in text.lines().enumerate() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() < 6 {
            return Err(DriverError(format!(
                "pgbench log line {}: `{l}` has fewer than 6 fields",
                i + 1
            )));
        }
        let num = |s: &str| {
            s.parse::<u64>().map_err(|_| {
                DriverError(format!("pgbench log line {}: `{s}` is not a number", i + 1))
            })
        };
        let end_us = num(f[4])? * 1_000_000 + num(f[5])?;
        let latency_us = f[2].parse::<u64>().ok();
        let retries = match retries_field {
            Some(k) => num(f.get(k).ok_or_else(|| {
                DriverError(format!(
                    "pgbench log line {}: `{l}` has no retries field",
                    i + 1
                ))
            })?)?,
            None => 0,
        };
        lines.push(Line {
            latency_us,
            outcome: f[2].to_string(),
            end_us,
            retries,
        });
    }
    let start_of = |l: &Line| l.end_us.saturating_sub(l.latency_us.unwrap_or(0));
    let t0 = lines.iter().map(start_of).min().unwrap_or(0);
    let from = t0 + warmup.as_micros() as u64;
    let to = duration
        .map(|d| from + d.as_micros() as u64)
        .unwrap_or(u64::MAX);
    let mut hist = Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3)
        .map_err(|x| DriverError(x.to_string()))?;
    let mut failures = BTreeMap::new();
    let (mut transactions, mut skipped, mut late, mut last_end) = (0u64, 0u64, 0u64, from);
    let mut retries = 0;
    let mut per_second: Vec<SecondStat> = Vec::new();
    for l in &lines {
        let start = start_of(l);
        if start < from || start >= to {
            continue;
        }
        retries += l.retries;
        match l.latency_us {
            Some(us) => {
                transactions += 1;
                hist.saturating_record(us.max(1));
                if latency_limit.is_some_and(|lim| u128::from(us) > lim.as_micros()) {
                    late += 1;
                }
                let sec = ((start - from) / 1_000_000) as usize;
                if per_second.len() <= sec {
                    per_second.resize(sec + 1, SecondStat::default());
                }
                per_second[sec].record(us);
                last_end = last_end.max(l.end_us);
            }
            None if l.outcome == "skipped" => skipped += 1,
            None => {
                let class = if l.outcome == "failed" {
                    "other"
                } else {
                    l.outcome.as_str()
                };
                *failures.entry(class.to_string()).or_default() += 1;
            }
        }
    }
    let elapsed_s = match duration {
        Some(d) => d.as_secs_f64(),
        None => (last_end.saturating_sub(from)) as f64 / 1e6,
    };
    Ok(DriverResult {
        transactions,
        elapsed_s,
        histogram: hist,
        failures,
        retries,
        skipped,
        late,
        per_second,
        // Faults, and so the ledger, need pgfleet's driver.
        ledger: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_lines_become_results_with_warmup_left_out() {
        // client txn latency script epoch us
        let log = "0 0 500 0 1000 000500\n\
                   0 1 1000 0 1001 500000\n\
                   1 0 2000 0 1002 100000\n\
                   1 1 serialization 0 1002 200000\n\
                   1 2 skipped 0 1002 300000\n";
        let r = parse_log(
            log,
            Duration::from_secs(1),
            Some(Duration::from_secs(2)),
            Some(Duration::from_micros(1500)),
            None,
        )
        .unwrap();
        assert_eq!(
            r.transactions, 2,
            "the first transaction started in the warm-up"
        );
        assert_eq!(r.failures.get("serialization"), Some(&1));
        assert_eq!(r.skipped, 1);
        assert_eq!(r.late, 1);
        assert_eq!(r.histogram.max(), 2000);
        assert_eq!(r.retries, 0);
        assert!(parse_log("0 1 2", Duration::ZERO, None, None, None).is_err());
    }

    #[test]
    fn retries_are_read_after_the_schedule_lag() {
        // With --rate: ... time_us schedule_lag retries.
        let log = "0 0 500 0 1000 000500 40 2\n\
                   0 1 serialization 0 1000 900000 10 9\n";
        let r = parse_log(log, Duration::ZERO, None, None, Some(7)).unwrap();
        assert_eq!(r.retries, 11);
        assert_eq!(r.transactions, 1);
        let e = parse_log(
            "0 0 500 0 1000 000500\n",
            Duration::ZERO,
            None,
            None,
            Some(6),
        );
        assert!(e.unwrap_err().0.contains("no retries field"));
    }
}
