//! pgbench-compatible scripts: `\set var expr`, `\sleep n [us|ms|s]`, and SQL
//! commands (ending with `;`, possibly over several lines) with `:var`
//! substitution. Expressions follow pgbench's grammar and semantics: integer
//! and double arithmetic (integer overflow and division by zero are errors),
//! comparisons and booleans, bit operators, and pgbench's functions.
//!
//! Errors name the script and line: `random-update:1: unknown function `rnd``.

use std::fmt;

pub mod expr;
pub mod rng;

pub use expr::{BinOp, Env, Expr, Func, Value, Vars, eval, format_g15, parse_expr};

/// pgbench's built-in scripts, plus the seeds' random UPDATE.
pub const BUILTIN_SCRIPTS: &[(&str, &str, &str)] = &[
    (
        "tpcb-like",
        "pgbench's default: TPC-B-like transaction over accounts, tellers, branches, history",
        "\\set aid random(1, 100000 * :scale)
\\set bid random(1, 1 * :scale)
\\set tid random(1, 10 * :scale)
\\set delta random(-5000, 5000)
BEGIN;
UPDATE pgbench_accounts SET abalance = abalance + :delta WHERE aid = :aid;
SELECT abalance FROM pgbench_accounts WHERE aid = :aid;
UPDATE pgbench_tellers SET tbalance = tbalance + :delta WHERE tid = :tid;
UPDATE pgbench_branches SET bbalance = bbalance + :delta WHERE bid = :bid;
INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES (:tid, :bid, :aid, :delta, CURRENT_TIMESTAMP);
END;
",
    ),
    (
        "simple-update",
        "pgbench -N: accounts update, select and history insert",
        "\\set aid random(1, 100000 * :scale)
\\set bid random(1, 1 * :scale)
\\set tid random(1, 10 * :scale)
\\set delta random(-5000, 5000)
BEGIN;
UPDATE pgbench_accounts SET abalance = abalance + :delta WHERE aid = :aid;
SELECT abalance FROM pgbench_accounts WHERE aid = :aid;
INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES (:tid, :bid, :aid, :delta, CURRENT_TIMESTAMP);
END;
",
    ),
    (
        "select-only",
        "pgbench -S: one primary-key read of pgbench_accounts",
        "\\set aid random(1, 100000 * :scale)
SELECT abalance FROM pgbench_accounts WHERE aid = :aid;
",
    ),
    (
        "random-update",
        "seeds/002: one random UPDATE of pgbench_accounts (abalance + 1)",
        "\\set aid random(1, :naccounts)
UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = :aid;
",
    ),
];

pub fn builtin(name: &str) -> Option<&'static str> {
    BUILTIN_SCRIPTS.iter().find(|b| b.0 == name).map(|b| b.2)
}

#[derive(Debug, Clone, PartialEq)]
pub struct ScriptError {
    pub script: String,
    pub line: usize,
    pub message: String,
}

impl fmt::Display for ScriptError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.script, self.line, self.message)
    }
}

impl std::error::Error for ScriptError {}

#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    Set {
        var: String,
        expr: Expr,
    },
    /// Duration in microseconds (a constant or a variable's value times `unit_us`).
    Sleep {
        amount: Expr,
        unit_us: u64,
    },
    /// SQL with `:var` replaced by `$1..$n`; `params[i]` is the variable of `$i+1`.
    Sql {
        sql: String,
        params: Vec<String>,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct Script {
    pub name: String,
    /// (line number, command)
    pub commands: Vec<(usize, Command)>,
}

impl Script {
    pub fn parse(name: &str, text: &str) -> Result<Script, ScriptError> {
        let err = |line, message: String| ScriptError {
            script: name.into(),
            line,
            message,
        };
        let mut commands = Vec::new();
        let mut sql = String::new();
        let mut sql_line = 0;
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let trimmed = raw.trim();
            if sql.is_empty() && (trimmed.is_empty() || trimmed.starts_with("--")) {
                continue;
            }
            if sql.is_empty() && trimmed.starts_with('\\') {
                commands.push((line, parse_meta(trimmed).map_err(|m| err(line, m))?));
                continue;
            }
            if sql.is_empty() {
                sql_line = line;
            }
            let code = strip_comment(raw);
            sql.push_str(code);
            sql.push('\n');
            if code.trim_end().ends_with(';') {
                commands.push((sql_line, parse_sql(&sql).map_err(|m| err(sql_line, m))?));
                sql.clear();
            }
        }
        if !sql.trim().is_empty() {
            commands.push((sql_line, parse_sql(&sql).map_err(|m| err(sql_line, m))?));
        }
        if !commands
            .iter()
            .any(|(_, c)| matches!(c, Command::Sql { .. }))
        {
            return Err(err(1, "the script has no SQL command".into()));
        }
        Ok(Script {
            name: name.into(),
            commands,
        })
    }
}

/// Drops a `--` comment outside quotes.
fn strip_comment(line: &str) -> &str {
    let mut in_quote = false;
    let b = line.as_bytes();
    for i in 0..b.len() {
        match b[i] {
            b'\'' => in_quote = !in_quote,
            b'-' if !in_quote && b.get(i + 1) == Some(&b'-') => return &line[..i],
            _ => {}
        }
    }
    line
}

fn parse_meta(line: &str) -> Result<Command, String> {
    let mut parts = line[1..].splitn(2, char::is_whitespace);
    let cmd = parts.next().unwrap_or("").to_ascii_lowercase();
    let rest = parts.next().unwrap_or("").trim();
    match cmd.as_str() {
        "set" => {
            let mut p = rest.splitn(2, char::is_whitespace);
            let var = p.next().unwrap_or("");
            if var.is_empty() {
                return Err("missing argument in command \"set\"".into());
            }
            if !is_var_name(var) {
                return Err(format!("invalid variable name: \"{var}\""));
            }
            let expr_text = p.next().unwrap_or("").trim();
            if expr_text.is_empty() {
                return Err(format!(
                    "syntax error in command \"set\": missing expression for {var}"
                ));
            }
            Ok(Command::Set {
                var: var.into(),
                expr: parse_expr(expr_text)
                    .map_err(|e| format!("syntax error in command \"set\": {e}"))?,
            })
        }
        "sleep" => {
            // pgbench's forms: N, N UNIT, NUNIT, :var, :var UNIT.
            let mut args: Vec<&str> = rest.split_whitespace().collect();
            if args.is_empty() {
                return Err("missing argument in command \"sleep\"".into());
            }
            if args.len() > 2 {
                return Err("too many arguments in command \"sleep\"".into());
            }
            let amount = if let Some(v) = args[0].strip_prefix(':') {
                Expr::Var(v.into())
            } else {
                let a = args[0];
                let unsigned = a.strip_prefix(['+', '-']).unwrap_or(a);
                let digits = unsigned.len()
                    - unsigned
                        .trim_start_matches(|c: char| c.is_ascii_digit())
                        .len();
                let (number, unit) = a.split_at(a.len() - unsigned.len() + digits);
                if digits == 0 || (!unit.is_empty() && args.len() == 2) {
                    return Err(format!("invalid sleep time, must be an integer: \"{a}\""));
                }
                if !unit.is_empty() {
                    args.push(unit);
                }
                Expr::Const(Value::Int(number.parse().map_err(|_| {
                    format!("invalid sleep time, must be an integer: \"{a}\"")
                })?))
            };
            let unit_us = match args.get(1).map(|u| u.to_ascii_lowercase()).as_deref() {
                None | Some("s") => 1_000_000,
                Some("ms") => 1_000,
                Some("us") => 1,
                Some(u) => {
                    return Err(format!(
                        "unrecognized time unit, must be us, ms or s: \"{u}\""
                    ));
                }
            };
            Ok(Command::Sleep { amount, unit_us })
        }
        other => Err(format!(
            "invalid command \\{other}: pgfleet runs \\set and \\sleep"
        )),
    }
}

fn is_var_name(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_alphanumeric() || c == '_')
}

/// Replaces `:var` (not `::type`, not inside quotes) by `$n`.
fn parse_sql(sql: &str) -> Result<Command, String> {
    let mut out = String::new();
    let mut params: Vec<String> = Vec::new();
    let chars: Vec<char> = sql.trim().chars().collect();
    let mut i = 0;
    let mut in_quote = false;
    while i < chars.len() {
        let c = chars[i];
        if c == '\'' {
            in_quote = !in_quote;
        }
        if c == ':' && !in_quote {
            if chars.get(i + 1) == Some(&':') {
                out.push_str("::");
                i += 2;
                continue;
            }
            let start = i + 1;
            let mut j = start;
            while j < chars.len() && (chars[j].is_ascii_alphanumeric() || chars[j] == '_') {
                j += 1;
            }
            if j > start && !(i > 0 && chars[i - 1] == ':') {
                let name: String = chars[start..j].iter().collect();
                let n = match params.iter().position(|p| *p == name) {
                    Some(n) => n + 1,
                    None => {
                        params.push(name);
                        params.len()
                    }
                };
                out.push_str(&format!("${n}"));
                i = j;
                continue;
            }
        }
        out.push(c);
        i += 1;
    }
    let sql = out.trim().trim_end_matches(';').trim().to_string();
    if sql.is_empty() {
        return Err("empty SQL command".into());
    }
    Ok(Command::Sql { sql, params })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(s: &str) -> Result<Value, String> {
        let vars: Vars = [
            ("scale".to_string(), Value::Int(10)),
            ("x".to_string(), Value::Double(1.5)),
        ]
        .into_iter()
        .collect();
        let mut rng = rng::Rng::seeded(7);
        let mut env = Env {
            vars: &vars,
            rng: &mut rng,
            debug: None,
        };
        eval(&parse_expr(s).map_err(|e| e.to_string())?, &mut env)
    }

    #[test]
    fn arithmetic_follows_pgbench() {
        assert_eq!(ev("1 + 2 * 3").unwrap(), Value::Int(7));
        assert_eq!(ev("(1 + 2) * 3").unwrap(), Value::Int(9));
        assert_eq!(ev("7 / 2").unwrap(), Value::Int(3));
        assert_eq!(ev("-7 / 2").unwrap(), Value::Int(-3));
        assert_eq!(ev("-7 % 3").unwrap(), Value::Int(-1));
        assert_eq!(ev("7.0 / 2").unwrap(), Value::Double(3.5));
        assert_eq!(ev("100000 * :scale").unwrap(), Value::Int(1_000_000));
        assert_eq!(ev(":x * 2").unwrap(), Value::Double(3.0));
        assert_eq!(ev("1 << 4 | 1").unwrap(), Value::Int(17));
        assert_eq!(ev("~0").unwrap(), Value::Int(-1));
        assert_eq!(ev("5 # 3").unwrap(), Value::Int(6));
        assert_eq!(ev("1 < 2 and not 3 = 4").unwrap(), Value::Bool(true));
        assert_eq!(ev("1.5e1").unwrap(), Value::Double(15.0));
        assert!(ev("1 / 0").unwrap_err().contains("division by zero"));
        assert_eq!(ev("1.0 / 0").unwrap(), Value::Double(f64::INFINITY));
        assert!(
            ev("9223372036854775807 + 1")
                .unwrap_err()
                .contains("out of range")
        );
        assert!(
            ev(":nope")
                .unwrap_err()
                .contains("undefined variable \"nope\"")
        );
    }

    #[test]
    fn functions_follow_pgbench() {
        assert_eq!(ev("abs(-5)").unwrap(), Value::Int(5));
        assert_eq!(ev("least(3, 1, 2)").unwrap(), Value::Int(1));
        assert_eq!(ev("greatest(3, 1.5)").unwrap(), Value::Double(3.0));
        assert_eq!(ev("int(5.9)").unwrap(), Value::Int(6), "pgbench rounds");
        assert_eq!(ev("double(2)").unwrap(), Value::Double(2.0));
        assert_eq!(ev("sqrt(16)").unwrap(), Value::Double(4.0));
        assert_eq!(ev("pow(2, 10)").unwrap(), Value::Double(1024.0));
        assert_eq!(ev("mod(10, 3)").unwrap(), Value::Int(1));
        assert_eq!(ev("pi()").unwrap(), Value::Double(std::f64::consts::PI));
        assert!(
            ev("hash(1)").unwrap_err().contains("default_seed"),
            "hash's default seed is the variable"
        );
        for _ in 0..100 {
            let Value::Int(v) = ev("random(1, :scale)").unwrap() else {
                panic!()
            };
            assert!((1..=10).contains(&v));
        }
        assert_eq!(ev("random(5, 5)").unwrap(), Value::Int(5));
        assert!(ev("random(2, 1)").unwrap_err().contains("empty range"));
        assert!(
            ev("random_gaussian(1, 10, 1.5)")
                .unwrap_err()
                .contains("at least 2.000000")
        );
        assert!(
            ev("random_exponential(1, 10, 0)")
                .unwrap_err()
                .contains("greater than zero")
        );
        assert!(
            ev("random_zipfian(1, 10, 1.0)")
                .unwrap_err()
                .contains("[1.001, 1000]")
        );
        assert!(ev("random_zipfian(1, 10, 1.5)").is_ok());
        assert!(
            ev("rnd(1, 2)")
                .unwrap_err()
                .contains("unexpected function name \"rnd\"")
        );
        assert!(
            ev("random(1)")
                .unwrap_err()
                .contains("unexpected number of arguments")
        );
        assert!(ev("1 +").is_err());
    }

    #[test]
    fn scripts_parse_with_lines_and_parameters() {
        let s = Script::parse(
            "tpcb",
            "-- comment\n\\set aid random(1, 100000 * :scale)\n\\set delta random(-5000, 5000)\nBEGIN;\n\
             UPDATE pgbench_accounts\n   SET abalance = abalance + :delta WHERE aid = :aid; -- trailing\n\
             SELECT ':notavar', x::int, :aid FROM t;\n\\sleep 10 ms\nEND;\n",
        )
        .unwrap();
        assert_eq!(s.commands.len(), 7);
        assert_eq!(s.commands[0].0, 2);
        assert_eq!(
            s.commands[3].0, 5,
            "multi-line SQL is numbered by its first line"
        );
        assert_eq!(
            s.commands[3].1,
            Command::Sql {
                sql: "UPDATE pgbench_accounts\n   SET abalance = abalance + $1 WHERE aid = $2"
                    .into(),
                params: vec!["delta".into(), "aid".into()]
            }
        );
        assert_eq!(
            s.commands[4].1,
            Command::Sql {
                sql: "SELECT ':notavar', x::int, $1 FROM t".into(),
                params: vec!["aid".into()]
            }
        );
        assert_eq!(
            s.commands[5].1,
            Command::Sleep {
                amount: Expr::Const(Value::Int(10)),
                unit_us: 1000
            }
        );
    }

    #[test]
    fn script_errors_name_script_and_line() {
        let e = Script::parse("mine", "SELECT 1;\n\\set x rnd(1, 2)\n").unwrap_err();
        assert_eq!((e.script.as_str(), e.line), ("mine", 2));
        assert!(
            e.to_string().starts_with(
                "mine:2: syntax error in command \"set\": unexpected function name \"rnd\""
            ),
            "{e}"
        );
        let e = Script::parse("mine", "\\shell ls\nSELECT 1;").unwrap_err();
        assert!(
            e.to_string().starts_with("mine:1: invalid command \\shell"),
            "{e}"
        );
        let e = Script::parse("mine", "\\set x 1\n").unwrap_err();
        assert!(e.message.contains("no SQL"), "{e}");
        let e = Script::parse("mine", "SELECT 1;\n\\sleep 1 min\n").unwrap_err();
        assert_eq!(e.line, 2);
    }
}
