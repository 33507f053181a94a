//! Reads pgbench_invalid_scripts.txt (its header gives the format); shared
//! by the parser's tests here and the agent's tests against the real
//! pgbench (`#[path]`-included there).

pub struct Case {
    pub name: String,
    /// The TAP file it comes from: `001` or `002`.
    pub from: String,
    /// pgbench's exit status: 1 refused before running, 2 failed running.
    pub status: u8,
    pub expect: Vec<String>,
    pub script: String,
}

/// The TAP run's `-D` definitions, then the cases in file order.
pub fn cases() -> (Vec<(String, String)>, Vec<Case>) {
    let text = include_str!("pgbench_invalid_scripts.txt");
    let mut defines = Vec::new();
    let mut cases: Vec<Case> = Vec::new();
    let mut lines = text.lines().enumerate();
    while let Some((n, line)) = lines.next() {
        let at = |what: &str| format!("pgbench_invalid_scripts.txt:{}: {what}", n + 1);
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        if let Some(d) = line.strip_prefix("defines: ") {
            for kv in d.split_whitespace() {
                let (k, v) = kv
                    .split_once('=')
                    .unwrap_or_else(|| panic!("{}", at("defines: name=value")));
                defines.push((k.to_string(), v.to_string()));
            }
        } else if let Some(name) = line.strip_prefix("== ") {
            cases.push(Case {
                name: name.to_string(),
                from: String::new(),
                status: 0,
                expect: Vec::new(),
                script: String::new(),
            });
        } else {
            let case = cases
                .last_mut()
                .unwrap_or_else(|| panic!("{}", at("a field before any `== name`")));
            if let Some(f) = line.strip_prefix("from: ") {
                case.from = f.to_string();
            } else if let Some(s) = line.strip_prefix("status: ") {
                case.status = s
                    .parse()
                    .unwrap_or_else(|_| panic!("{}", at("status: 1 or 2")));
            } else if let Some(e) = line.strip_prefix("expect: ") {
                case.expect.push(e.to_string());
            } else if line == "<<<" {
                for (_, l) in lines.by_ref() {
                    if l == ">>>" {
                        break;
                    }
                    case.script.push_str(l);
                    case.script.push('\n');
                }
            } else {
                panic!("{}", at(&format!("unexpected line {line:?}")));
            }
        }
    }
    for c in &cases {
        assert!(
            matches!(c.status, 1 | 2) && !c.expect.is_empty() && !c.from.is_empty(),
            "case {:?} lacks a field",
            c.name
        );
    }
    (defines, cases)
}
