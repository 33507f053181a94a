//! The agent session's security end to end: TLS with a CA-signed
//! certificate, a join token, and the agents the controller refuses (wrong
//! token, plaintext to a TLS controller, no CA, an id the run did not
//! launch), each with a clear error on both sides and nothing left behind.

mod common;

use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Scratch, agent_bin, show};

fn certificates(s: &Scratch) {
    common::certificates(&s.dir, &["127.0.0.1", "localhost"]);
}

const SCENARIO: &str = "name: secure
fleet:
  - name: local
    count: 1
workloads:
  - kind: pgbench
    scale: 1
    script: select-only
    duration_s: DURATION
";

#[test]
fn agents_join_over_tls_with_the_join_token() {
    let s = Scratch::new("tls");
    certificates(&s);
    s.write("token", "0123456789abcdef0123456789abcdef\n");
    let sc = s.write("sc.yaml", &SCENARIO.replace("DURATION", "2"));
    let (cert, key, token) = (
        s.dir.join("server.pem"),
        s.dir.join("server.key"),
        s.dir.join("token"),
    );
    let out = s
        .run_cmd(
            &sc,
            &[
                "--tls-cert",
                cert.to_str().unwrap(),
                "--tls-key",
                key.to_str().unwrap(),
                "--join-token-file",
                token.to_str().unwrap(),
            ],
        )
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    let log = std::fs::read_to_string(s.out().join("logs/local-0.log")).unwrap();
    assert!(
        log.contains("registered") && log.contains("controller=https://127.0.0.1:"),
        "{log}"
    );
    let r = s.report();
    assert_eq!(r["status"], "succeeded");
    s.assert_clean(&common::ports(&r));
}

/// Runs an extra agent against the running controller; returns its exit
/// code and its stderr.
fn intruder(s: &Scratch, args: &[&str]) -> (Option<i32>, String) {
    let root = s.dir.join("intruder");
    let out = Command::new(agent_bin())
        .arg("run")
        .args([
            "--agent-id",
            "intruder",
            "--instance-class",
            "local",
            "--give-up-after-s",
            "3",
        ])
        .arg("--data-root")
        .arg(&root)
        .args(args)
        .env("PGFLEET_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!root.exists(), "the refused agent left {}", root.display());
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    eprintln!("refused agent {args:?}: {}", err.trim());
    (out.status.code(), err)
}

#[test]
fn wrong_tokens_plaintext_missing_ca_and_unknown_agents_are_refused_clearly() {
    let s = Scratch::new("refuse");
    certificates(&s);
    s.write("token", "0123456789abcdef0123456789abcdef");
    s.write("wrong", "fedcba9876543210fedcba9876543210");
    let sc = s.write("sc.yaml", &SCENARIO.replace("DURATION", "12"));
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let p = |f: &str| s.dir.join(f).to_str().unwrap().to_string();
    let bind = format!("127.0.0.1:{port}");
    let child = s
        .run_cmd(
            &sc,
            &[
                "--bind",
                &bind,
                "--tls-cert",
                &p("server.pem"),
                "--tls-key",
                &p("server.key"),
                "--join-token-file",
                &p("token"),
            ],
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until the run's own agent works: the controller is up.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string(s.out().join("logs/local-0.log"))
        .is_ok_and(|l| l.contains("assigned"))
    {
        assert!(
            Instant::now() < deadline,
            "the run's agent never got its cell"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let https = format!("https://127.0.0.1:{port}");
    let http = format!("http://127.0.0.1:{port}");

    let (code, err) = intruder(
        &s,
        &[
            "--controller",
            &https,
            "--ca",
            &p("ca.pem"),
            "--token-file",
            &p("wrong"),
        ],
    );
    assert_ne!(code, Some(0), "{err}");
    assert!(
        err.contains("refused this agent") && err.contains("join token"),
        "{err}"
    );
    // A refusal ends the agent at once: it did not retry until giving up
    // (which says "unreachable"); no wall-clock bound, as a loaded host
    // may take seconds to start a process and finish a TLS handshake.
    assert!(
        !err.contains("unreachable"),
        "a refusal is not retried: {err}"
    );

    let (code, err) = intruder(&s, &["--controller", &https, "--token-file", &p("token")]);
    assert_ne!(code, Some(0), "{err}");
    assert!(err.contains("--ca"), "{err}");

    let (code, err) = intruder(&s, &["--controller", &http, "--token-file", &p("token")]);
    assert_ne!(code, Some(0), "{err}");
    assert!(
        err.contains("unreachable") && err.contains("https:// with --ca"),
        "{err}"
    );

    let (code, err) = intruder(
        &s,
        &[
            "--controller",
            &https,
            "--ca",
            &p("ca.pem"),
            "--token-file",
            &p("token"),
        ],
    );
    assert_ne!(code, Some(0), "{err}");
    assert!(
        err.contains("unknown agent `intruder`") && err.contains("local-0"),
        "{err}"
    );

    // The run went on and says whom it refused.
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("refused agent intruder"), "{stderr}");
    s.assert_clean(&common::ports(&s.report()));
}

/// The break-ins through `pgfleet run`, as a user would try them: a
/// script that runs a program and one that reads a server file fail their
/// cells with PostgreSQL's permission error (exit 3, the marker never
/// written, the report naming the role that ran the SQL); each setting that
/// runs a command or loads code is refused before anything starts (exit 2,
/// the file's line and the setting named).
#[test]
fn scenario_text_cannot_reach_the_agent_host() {
    use std::os::unix::fs::PermissionsExt;
    let s = Scratch::new("break-in");
    let markers = s.dir.join("markers");
    std::fs::create_dir_all(&markers).unwrap();
    std::fs::set_permissions(&markers, std::fs::Permissions::from_mode(0o777)).unwrap();
    let marker = markers.join("pwned");
    let sc = s.write(
        "sc.yaml",
        &format!(
            "name: break-in
fleet:
  - name: local
    count: 1
workloads:
  - kind: pgbench
    scale: 1
    transactions: 1
    warmup_s: 0
    script_text: \"COPY (SELECT 1) TO PROGRAM 'touch {m}';\"
  - kind: pgbench
    scale: 1
    transactions: 1
    warmup_s: 0
    script_text: \"SELECT pg_read_file('/etc/passwd');\"
",
            m = marker.display()
        ),
    );
    let out = s.run_cmd(&sc, &[]).output().unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", show(&out));
    assert!(!marker.exists(), "a scenario script ran a program");
    let r = s.report();
    let errors: Vec<&str> = r["cells"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["error"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(errors.len(), 2, "{r}");
    assert!(
        errors
            .iter()
            // 15 names the role it takes; 18 says "permission denied".
            .any(|e| e.contains("to COPY to or from an external program")),
        "{errors:?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.contains("permission denied for function pg_read_file")),
        "{errors:?}"
    );
    let md = std::fs::read_to_string(s.out().join("report.md")).unwrap();
    assert!(
        md.contains(
            "scenario SQL (scripts, defines, setup_sql) ran as `pgfleet_workload` (no superuser"
        ),
        "{md}"
    );
    s.assert_clean(&common::ports(&r));

    for (setting, value) in [
        ("archive_command", "'touch /tmp/pwned; true'"),
        ("restore_command", "'true'"),
        ("archive_library", "x"),
        ("ssl_passphrase_command", "'true'"),
        ("shared_preload_libraries", "x"),
        ("local_preload_libraries", "x"),
        ("session_preload_libraries", "x"),
        ("dynamic_library_path", "/tmp"),
    ] {
        let sc = s.write(
            "settings.yaml",
            &format!(
                "name: settings
fleet:
  - name: local
    postgres:
      settings:
        {setting}: {value}
workloads:
  - kind: pgbench-init
    scale: 1
"
            ),
        );
        let out = s.run_cmd(&sc, &[]).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{setting}: {}", show(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("settings.yaml:6:")
                && err.contains(setting)
                && err.contains("allow_shell"),
            "{setting}: {err}"
        );
    }
}

/// The break-in corpus (`scenarios/attacks/`), each file run with `pgfleet
/// run`: what it says is refused is refused before anything starts, located
/// (exit 2, `file:line:` and the field); what it says is contained runs and
/// reaches nothing: no marker in the world-writable directory it aims at,
/// no host file text in any report or log, nothing left behind.
#[test]
fn the_break_in_corpus_fails_safely_under_run() {
    use std::os::unix::fs::PermissionsExt;
    let s = Scratch::new("corpus");
    let markers = s.dir.join("markers");
    std::fs::create_dir_all(&markers).unwrap();
    std::fs::set_permissions(&markers, std::fs::Permissions::from_mode(0o777)).unwrap();
    let files = common::attack_files();
    assert!(files.len() >= 15, "{files:?}");
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let name = f.file_name().unwrap().to_string_lossy().to_string();
        let refused = text.contains("# expect: refused");
        assert!(
            refused || text.contains("# expect: contained"),
            "{name} says neither"
        );
        let sc = s.write(
            &name,
            &text.replace("MARKER_DIR", markers.to_str().unwrap()),
        );
        let _ = std::fs::remove_dir_all(s.out());
        let out = s.run_cmd(&sc, &[]).output().unwrap();
        if refused {
            assert_eq!(out.status.code(), Some(2), "{name}: {}", show(&out));
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                err.contains(&format!("{name}:")) && err.contains("field `"),
                "{name}: {err}"
            );
        } else {
            assert!(
                matches!(out.status.code(), Some(0) | Some(3)),
                "{name}: {}",
                show(&out)
            );
        }
        let planted: Vec<_> = std::fs::read_dir(&markers)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .collect();
        assert!(
            planted.is_empty(),
            "{name} reached the host: {planted:?}\n{}",
            show(&out)
        );
        let mut seen = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        for e in std::fs::read_dir(s.out()).into_iter().flatten().flatten() {
            if e.path().is_file() {
                seen += &String::from_utf8_lossy(&std::fs::read(e.path()).unwrap());
            }
        }
        assert!(
            !seen.contains("root:x:0:0"),
            "{name}: host file text in its output"
        );
        if !refused {
            s.assert_clean(&common::ports(&s.report()));
        }
    }
}

/// In a pod PostgreSQL runs as the agent's own uid, so the join token comes
/// in the environment, not as a file: the agent reads it once, removes it
/// and makes itself non-dumpable. A process of the same uid (what a
/// scenario-steered server would be) cannot read the agent's environment.
#[test]
fn a_process_of_the_agents_uid_cannot_read_its_join_token() {
    use std::os::unix::process::CommandExt;
    let s = Scratch::new("token-env");
    let pg = nix::unistd::User::from_name("postgres")
        .unwrap()
        .expect("user postgres");
    let (uid, gid) = (pg.uid.as_raw(), pg.gid.as_raw());
    let data = s.dir.join("agent-data");
    std::fs::create_dir_all(&data).unwrap();
    nix::unistd::chown(&data, Some(pg.uid), Some(pg.gid)).unwrap();
    let secret = "join-token-that-must-stay-secret-0123456789";
    let mut agent = Command::new(agent_bin())
        .args([
            "run",
            "--controller",
            "http://127.0.0.1:9",
            "--class",
            "local",
        ])
        .args(["--agent-id", "token-env", "--give-up-after-s", "30"])
        .arg("--data-root")
        .arg(&data)
        .env("PGFLEET_JOIN_TOKEN", secret)
        .uid(uid)
        .gid(gid)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(1));
    let pid = agent.id();
    let peek = Command::new("cat")
        .arg(format!("/proc/{pid}/environ"))
        .uid(uid)
        .gid(gid)
        .output()
        .unwrap();
    let _ = agent.kill();
    let _ = agent.wait();
    assert!(
        !String::from_utf8_lossy(&peek.stdout).contains(secret),
        "the token was readable by the agent's uid"
    );
    assert!(
        !peek.status.success(),
        "{}",
        String::from_utf8_lossy(&peek.stderr)
    );
    // Control: the same read of a dumpable process of that uid works.
    let mut other = Command::new("sleep")
        .arg("5")
        .env("X", secret)
        .uid(uid)
        .gid(gid)
        .spawn()
        .unwrap();
    let control = Command::new("cat")
        .arg(format!("/proc/{}/environ", other.id()))
        .uid(uid)
        .gid(gid)
        .output()
        .unwrap();
    let _ = other.kill();
    let _ = other.wait();
    assert!(String::from_utf8_lossy(&control.stdout).contains(secret));
}
