//! pgbench's expression semantics, case by case. The reference facts are
//! pgbench's own: the expected values of its TAP expression test
//! (`001_pgbench_with_server.pl`, run with `--random-seed=5432
//! -Dfoo=-10.1 -Dbla=false -Di=+3 -Dn=null -Dt=t -Df=of -Dd=1.0`, client 0,
//! scale 1), the error classes of its invalid-script list, and values the
//! real pgbench 15 printed with `debug()` for the cases that test leaves
//! out. agent/tests/pgbench_compat.rs runs the same cases through the real
//! binary where it is installed.

use pgfleet_proto::script::rng::{Seeds, permute};
use pgfleet_proto::script::{Command, Env, Script, Value, Var, Vars, eval, format_g15, parse_expr};

/// The TAP run's variables: its -D switches (text, as -D keeps them),
/// then pgbench's automatic ones.
fn tap_vars() -> Vars {
    let mut vars = Vars::default();
    for (k, v) in [
        ("foo", "-10.1"),
        ("bla", "false"),
        ("i", "+3"),
        ("n", "null"),
        ("t", "t"),
        ("f", "of"),
        ("d", "1.0"),
    ] {
        vars.insert(k.into(), Var::Text(v.into()));
    }
    let seeds = Seeds::new(5432, 1, 1);
    vars.insert("scale".into(), Value::Int(1).into());
    vars.insert("client_id".into(), Value::Int(0).into());
    vars.insert("random_seed".into(), Value::Int(5432).into());
    vars.insert("default_seed".into(), Value::Int(seeds.default_seed).into());
    vars
}

/// Runs `\set` lines in order, as one client; returns each debug() value.
fn run_sets(lines: &[(&str, &str)]) -> Vec<(String, String)> {
    let seeds = Seeds::new(5432, 1, 1);
    let mut rng = seeds.clients[0];
    let mut vars = tap_vars();
    let mut out = Vec::new();
    for (var, expr) in lines {
        let e = parse_expr(expr).unwrap_or_else(|e| panic!("{expr}: {e}"));
        let mut debug = Vec::new();
        let v = eval(
            &e,
            &mut Env {
                vars: &vars,
                rng: &mut rng,
                debug: Some(&mut debug),
            },
        )
        .unwrap_or_else(|e| panic!("{expr}: {e}"));
        vars.insert(var.to_string(), v.into());
        for d in debug {
            out.push((expr.to_string(), d.debug_text()));
        }
    }
    out
}

#[test]
fn the_tap_expression_script_prints_what_pgbench_prints() {
    // (variable, expression, pgbench's debug output as the TAP test
    // matches it: the text, then a word boundary); None: not checked there.
    let cases: &[(&str, &str, Option<&str>)] = &[
        ("i1", "debug(random(10, 19))", Some("int 17")),
        (
            "i2",
            "debug(random_exponential(100, 199, 10.0))",
            Some("int 104"),
        ),
        (
            "i3",
            "debug(random_gaussian(1000, 1999, 10.0))",
            Some("int 1498"),
        ),
        ("i4", "debug(abs(-4))", Some("int 4")),
        ("i5", "debug(greatest(5, 4, 3, 2))", Some("int 5")),
        ("i6", "debug(11 + least(-5, -4, -3, -2))", Some("int 6")),
        ("i7", "debug(int(7.3))", Some("int 7")),
        ("i8", "debug(17 / (4|1) + ( 4 + (7 >> 2)))", Some("int 8")),
        (
            "i9",
            "debug(- (3 * 4 - (-(~ 1) + -(~ 0))) / -1 + 3 % -1)",
            Some("int 9"),
        ),
        ("ia", "debug(10 + (0 + 0 * 0 - 0 / 1))", Some("int 10")),
        ("ib", "debug(:ia + :scale)", Some("int 11")),
        (
            "ic",
            "debug(64 % (((2 + 1 * 2 + (1 # 2) | 4 * (2 & 11)) - (1 << 2)) + 2))",
            Some("int 12"),
        ),
        ("d1", "debug(sqrt(+1.5 * 2.0) * abs(-0.8E1))", None),
        ("d2", "debug(double(1 + 1) * (-75.0 / :foo))", None),
        ("pi", "debug(pi() * 4.9)", Some("double 15")),
        (
            "d4",
            "debug(greatest(4, 2, -1.17) * 4.0 * Ln(Exp(1.0)))",
            Some("double 16"),
        ),
        (
            "d5",
            "debug(least(-5.18, .0E0, 1.0/0) * -3.3)",
            Some("double 17"),
        ),
        ("i1", "0", None),
        ("d1", "false", None),
        ("id", "debug(random_zipfian(1, 9, 1.3))", Some("int 3")),
        ("poweri", "debug(pow(-3,3))", Some("double -27")),
        ("powerd", "debug(pow(2.0,10))", Some("double 1024")),
        ("poweriz", "debug(pow(0,0))", Some("double 1")),
        ("powerdz", "debug(pow(0.0,0.0))", Some("double 1")),
        ("powernegi", "debug(pow(-2,-3))", Some("double -0.125")),
        ("powernegd", "debug(pow(-2.0,-3.0))", Some("double -0.125")),
        (
            "powernegd2",
            "debug(power(-5.0,-5.0))",
            Some("double -0.00032"),
        ),
        (
            "powerov",
            "debug(pow(9223372036854775807, 2))",
            Some("double 8.50705917302346e+37"),
        ),
        ("powerov2", "debug(pow(10,30))", Some("double 1e+30")),
        (
            "c0",
            "debug(1.0 = 0.0 and 1.0 != 0.0)",
            Some("boolean false"),
        ),
        ("c1", "debug(0 = 1 Or 1.0 = 1)", Some("boolean true")),
        (
            "c4",
            "debug(case when 0 < 1 then 32 else 0 end)",
            Some("int 32"),
        ),
        (
            "c5",
            "debug(case when true then 33 else 0 end)",
            Some("int 33"),
        ),
        (
            "c6",
            "debug(case when false THEN -1 when 1 = 1 then 13 + 19 + 2.0 end )",
            Some("double 34"),
        ),
        (
            "c7",
            "debug(case when (1 > 0) and (1 >= 0) and (0 < 1) and (0 <= 1) and (0 != 1) and (0 = 0) and (0 <> 1) then 35 else 0 end)",
            Some("int 35"),
        ),
        (
            "c8",
            "debug(CASE WHEN (1.0 > 0.0) AND (1.0 >= 0.0) AND (0.0 < 1.0) AND (0.0 <= 1.0) AND (0.0 != 1.0) AND (0.0 = 0.0) AND (0.0 <> 1.0) AND (0.0 = 0.0) THEN 36 ELSE 0 END)",
            Some("int 36"),
        ),
        (
            "c9",
            "debug(CASE WHEN NOT FALSE THEN 3 * 12.3333334 END)",
            Some("double 37"),
        ),
        (
            "ca",
            "debug(case when false then 0 when 1-1 <> 0 then 1 else 38 end)",
            Some("int 38"),
        ),
        (
            "cb",
            "debug(10 + mod(13 * 7 + 12, 13) - mod(-19 * 11 - 17, 19))",
            Some("int 39"),
        ),
        (
            "cc",
            "debug(NOT (0 > 1) AND (1 <= 1) AND NOT (0 >= 1) AND (0 < 1) AND NOT (false and true) AND (false OR TRUE) AND (NOT :f) AND (NOT FALSE) AND NOT (NOT TRUE))",
            Some("boolean true"),
        ),
        ("n0", "debug(NULL + NULL * exp(NULL))", Some("null")),
        ("n1", "debug(:n0)", Some("null")),
        (
            "n2",
            "debug(NOT (:n0 IS NOT NULL OR :d1 IS NULL))",
            Some("boolean true"),
        ),
        (
            "n3",
            "debug(:n0 IS NULL AND :d1 IS NOT NULL AND :d1 NOTNULL)",
            Some("boolean true"),
        ),
        (
            "n4",
            "debug(:n0 ISNULL AND NOT :n0 IS TRUE AND :n0 IS NOT FALSE)",
            Some("boolean true"),
        ),
        (
            "n5",
            "debug(CASE WHEN :n IS NULL THEN 46 ELSE NULL END)",
            Some("int 46"),
        ),
        (
            "n6",
            "debug(:n IS NULL AND NOT :f AND :t)",
            Some("boolean true"),
        ),
        (
            "cs",
            "debug(CASE WHEN 1 THEN TRUE END AND CASE WHEN 1.0 THEN TRUE END AND CASE WHEN :n THEN NULL ELSE TRUE END)",
            Some("boolean true"),
        ),
        (
            "h0",
            "debug(hash(10, 5432))",
            Some("int -5817877081768721676"),
        ),
        (
            "h1",
            "debug(:h0 = hash_murmur2(10, 5432))",
            Some("boolean true"),
        ),
        (
            "h3",
            "debug(hash_fnv1a(10, 5432))",
            Some("int -7793829335365542153"),
        ),
        ("h4", "debug(hash(10))", Some("int")),
        (
            "h5",
            "debug(hash(10) = hash(10, :default_seed))",
            Some("boolean true"),
        ),
        ("zy", "0", None),
        // Lazy evaluation: the TAP test checks that these do not fail.
        (
            "yz",
            "debug(case when :zy = 0 then -1 else (1 / :zy) end)",
            None,
        ),
        (
            "yz",
            "debug(case when :zy = 0 or (1 / :zy) < 0 then -1 else (1 / :zy) end)",
            None,
        ),
        (
            "yz",
            "debug(case when :zy > 0 and (1 / :zy) < 0 then (1 / :zy) else 1 end)",
            None,
        ),
        ("sc", "debug(:scale)", Some("int 1")),
        ("ci", "debug(:client_id)", Some("int 0")),
        ("rs", "debug(:random_seed)", Some("int 5432")),
        (
            "min",
            "debug(-9223372036854775808)",
            Some("int -9223372036854775808"),
        ),
        ("max", "debug(-(:min + 1))", Some("int 9223372036854775807")),
        (
            "t",
            "debug(permute(0, 2) + permute(1, 2) = 1)",
            Some("boolean true"),
        ),
        (
            "t",
            "debug(permute(0, 3) + permute(1, 3) + permute(2, 3) = 3)",
            Some("boolean true"),
        ),
        (
            "t",
            "debug(permute(0, 4) + permute(1, 4) + permute(2, 4) + permute(3, 4) = 6)",
            Some("boolean true"),
        ),
        (
            "t",
            "debug(permute(0, 5) + permute(1, 5) + permute(2, 5) + permute(3, 5) + permute(4, 5) = 10)",
            Some("boolean true"),
        ),
        (
            "t",
            "debug(permute(0, 16) + permute(1, 16) + permute(2, 16) + permute(3, 16) + permute(4, 16) + permute(5, 16) + permute(6, 16) + permute(7, 16) + permute(8, 16) + permute(9, 16) + permute(10, 16) + permute(11, 16) + permute(12, 16) + permute(13, 16) + permute(14, 16) + permute(15, 16) = 120)",
            Some("boolean true"),
        ),
        ("size", "random(2, 1000)", None),
        ("v", "random(0, :size - 1)", None),
        ("p", "permute(:v, :size)", None),
        (
            "t",
            "debug(0 <= :p and :p < :size and :p = permute(:v + :size, :size) and :p <> permute(:v + 1, :size))",
            Some("boolean true"),
        ),
        ("t", "debug(permute(:v, 1) = 0)", Some("boolean true")),
        (
            "t",
            "debug(permute(0, 2, 5431) = 0 and permute(1, 2, 5431) = 1 and permute(0, 2, 5433) = 1 and permute(1, 2, 5433) = 0)",
            Some("boolean true"),
        ),
        ("size", "debug(:max - 10)", None),
        (
            "t",
            "debug(permute(:size-1, :size, 5432) = 520382784483822430 and permute(:size-2, :size, 5432) = 1143715004660802862 and permute(:size-3, :size, 5432) = 447293596416496998 and permute(:size-4, :size, 5432) = 916527772266572956 and permute(:size-5, :size, 5432) = 2763809008686028849 and permute(:size-6, :size, 5432) = 8648551549198294572 and permute(:size-7, :size, 5432) = 4542876852200565125)",
            Some("boolean true"),
        ),
    ];
    let lines: Vec<(&str, &str)> = cases.iter().map(|c| (c.0, c.1)).collect();
    let got = run_sets(&lines);
    let want: Vec<(&str, Option<&str>)> = cases
        .iter()
        .filter(|c| c.1.contains("debug("))
        .map(|c| (c.1, c.2))
        .collect();
    assert_eq!(got.len(), want.len());
    let mut checked = 0;
    for ((expr, value), (_, expected)) in got.iter().zip(&want) {
        if let Some(e) = expected {
            let boundary = value
                .strip_prefix(e)
                .is_some_and(|rest| !rest.starts_with(|c: char| c.is_alphanumeric() || c == '_'));
            assert!(boundary, "{expr}: pgbench prints `{e}`, got `{value}`");
            checked += 1;
        }
    }
    // The TAP test checks 69 values: these 63, and its \\if chains'
    // six (commands 65, 74, 83, 86, 93, 95) in if_chains_take_the_branch_pgbench_takes.
    assert_eq!(checked, 63, "the TAP test's checked values");
}

/// Runs a script's meta-commands as one client's transaction (SQL is
/// skipped); returns the debug() values in order and the variables.
fn run_script(text: &str) -> (Vec<String>, Vars) {
    let script = Script::parse("s", text).unwrap_or_else(|e| panic!("{e}"));
    let mut rng = Seeds::new(5432, 1, 1).clients[0];
    let mut vars = tap_vars();
    let mut debug = Vec::new();
    let mut pc = 0;
    while let Some((_, c)) = script.commands.get(pc) {
        let mut env = Env {
            vars: &vars,
            rng: &mut rng,
            debug: Some(&mut debug),
        };
        match c {
            Command::Set { var, expr } => {
                let v = eval(expr, &mut env).unwrap();
                vars.insert(var.clone(), v.into());
                pc += 1;
            }
            Command::If { .. } | Command::Elif { .. } | Command::Else { .. } | Command::Endif => {
                pc = script.branch(pc, &mut env).unwrap();
            }
            _ => pc += 1,
        }
    }
    (debug.iter().map(|v| v.debug_text()).collect(), vars)
}

#[test]
fn if_chains_take_the_branch_pgbench_takes() {
    // The TAP test's five chains (a true \if; a true \elif; the \else;
    // \if without \else; \elif without \else), each setting a debug
    // value in the branch it must take and `nope` in every other.
    let (debug, vars) = run_script(
        "\\set nope 0
\\if 1 > 0
\\set id debug(65)
\\elif 0
\\set nope 1
\\else
\\set nope 1
\\endif
\\if 1 < 0
\\set nope 1
\\elif 1 > 0
\\set ie debug(74)
\\else
\\set nope 1
\\endif
\\if 1 < 0
\\set nope 1
\\elif 1 < 0
\\set nope 1
\\else
\\set if debug(83)
\\endif
\\IF 1 = 1
\\set ig debug(86)
\\elif 0
\\set nope 1
\\endif
\\if 1 = 0
\\set nope 1
\\elif 1 <> 0
\\set ih debug(93)
\\endif
\\set nope debug(:nope)
SELECT 1;
",
    );
    assert_eq!(
        debug,
        ["int 65", "int 74", "int 83", "int 86", "int 93", "int 0"]
    );
    assert_eq!(vars["nope"], Var::Value(Value::Int(0)));
    // Nested chains, NULL and double conditions (a condition's truth).
    let (debug, _) = run_script(
        "\\if NULL
\\set x debug(1)
\\elif 0.5
\\if false
\\set x debug(2)
\\else
\\set x debug(3)
\\endif
\\else
\\set x debug(4)
\\endif
",
    );
    assert_eq!(debug, ["int 3"]);
    // Every misuse pgbench reports.
    for (script, want) in [
        ("\\else\n", "\\else without matching \\if"),
        ("\\elif 1\n", "\\elif without matching \\if"),
        ("\\endif\n", "\\endif without matching \\if"),
        ("\\if 1\n\\else\n\\else\n\\endif\n", "\\else after \\else"),
        ("\\if 1\n\\else\n\\elif 0\n\\endif\n", "\\elif after \\else"),
        ("\\if 1\nSELECT 1;\n", "\\if without matching \\endif"),
        ("\\if\n\\endif\n", "syntax error in command \"if\""),
        ("\\if 1 +\n\\endif\n", "syntax error in command \"if\""),
        ("\\if 1\n\\else 2\n\\endif\n", "unexpected argument"),
    ] {
        let e = Script::parse("s", script).expect_err(script).to_string();
        assert!(e.contains(want), "{script:?}: {e}");
    }
}

#[test]
fn values_pgbench_15_printed_for_cases_its_test_leaves_out() {
    // Each was run through the real pgbench 15 with debug(); the list is
    // shared with agent/tests/pgbench_compat.rs, which runs it again.
    let cases: Vec<(String, String)> = include_str!("data/pgbench_values.tsv")
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (e, v) = l.split_once('\t').expect("expression<TAB>value");
            (e.to_string(), v.to_string())
        })
        .collect();
    assert!(cases.len() >= 60, "{}", cases.len());
    for (expr, want) in &cases {
        let got = run_sets(&[("x", &format!("debug({expr})"))]);
        assert_eq!(&got[0].1, want, "{expr}");
    }
}

#[path = "data/invalid_scripts.rs"]
mod invalid_scripts;

/// pgbench's invalid-script list (data/pgbench_invalid_scripts.txt, 73
/// cases): what pgbench refuses before running (status 1) the parser
/// refuses with pgbench's message; what fails when it runs (status 2)
/// parses, and where it is meta-commands only, fails here as pgbench
/// does. (agent/tests/pgbench_compat.rs runs all 73 through both drivers
/// and the real pgbench.)
#[test]
fn pgbench_s_invalid_scripts_fail_with_its_classes() {
    let (defines, cases) = invalid_scripts::cases();
    assert_eq!(cases.len(), 73);
    let mut vars = tap_vars();
    for (k, v) in defines {
        vars.insert(k, Var::Text(v.into()));
    }
    let mut ran = 0;
    for case in &cases {
        let parsed = Script::parse("case.sql", &case.script);
        let check = |e: &str| {
            for want in &case.expect {
                assert!(
                    e.contains(want.as_str()),
                    "{}: {e:?} lacks {want:?}",
                    case.name
                );
            }
        };
        if case.status == 1 {
            check(&parsed.expect_err(&case.name).to_string());
            continue;
        }
        let script = parsed.unwrap_or_else(|e| panic!("{} must parse: {e}", case.name));
        if script
            .commands
            .iter()
            .any(|(_, c)| matches!(c, Command::Sql { .. } | Command::Shell { .. }))
        {
            continue;
        }
        ran += 1;
        check(&run_meta(&script, &vars).expect_err(&case.name));
    }
    assert_eq!(ran, 23, "status-2 cases of meta-commands only");
}

/// Runs a script's meta-commands once as client 0; the first error.
fn run_meta(script: &Script, vars: &Vars) -> Result<(), String> {
    let mut vars = vars.clone();
    let mut rng = Seeds::new(1, 1, 1).clients[0];
    for (_, c) in &script.commands {
        let mut env = Env {
            vars: &vars,
            rng: &mut rng,
            debug: None,
        };
        match c {
            Command::Set { var, expr } => {
                let v = eval(expr, &mut env)?;
                vars.insert(var.clone(), v.into());
            }
            Command::Fail(m) => return Err(m.clone()),
            Command::Sleep {
                amount: pgfleet_proto::script::Expr::Var(v),
                ..
            } if !vars.contains_key(v) => {
                return Err(format!("\\sleep: undefined variable \"{v}\""));
            }
            _ => {}
        }
    }
    Ok(())
}

/// Expression errors the list leaves out, with pgbench's classes:
/// `parse` = the script is refused, `run` = the command fails running.
#[test]
fn pgbench_s_other_expression_errors() {
    let vars = tap_vars();
    for (class, expr, want) in [
        ("parse", "1 +", "syntax error"),
        ("parse", "1 < 2 < 3", "syntax error"),
        ("parse", "9223372036854775808", "syntax error"),
        ("parse", "1e400", "double constant overflow"),
        ("parse", "99999999999999999999", "bigint constant overflow"),
        ("run", "true = true", "cannot coerce boolean to int"),
        ("run", "true and 1", "cannot coerce int to boolean"),
        ("run", "false or 0", "cannot coerce int to boolean"),
        ("run", "1 and true", "cannot coerce int to boolean"),
    ] {
        let parsed = parse_expr(expr);
        if class == "parse" {
            let e = parsed.expect_err(expr).to_string();
            assert!(e.contains(want), "{expr}: {e}");
            continue;
        }
        let e = parsed.unwrap_or_else(|e| panic!("{expr} must parse: {e}"));
        let mut rng = Seeds::new(1, 1, 1).clients[0];
        let err = eval(
            &e,
            &mut Env {
                vars: &vars,
                rng: &mut rng,
                debug: None,
            },
        )
        .expect_err(expr);
        assert!(err.contains(want), "{expr}: {err}");
    }
    // Malformed variable text is refused when an expression reads it.
    let e = Value::parse_text("foo", "bla").unwrap_err();
    assert!(
        e.contains("malformed variable \"foo\" value: \"bla\""),
        "{e}"
    );
    assert!(Value::parse_text("badtrue", "trueXXX").is_err());
}

#[test]
fn errors_show_the_command_and_the_position_as_pgbench_does() {
    // What pgbench 15 prints for these, its first three lines.
    for (script, want) in [
        (
            "\\set i 1 +\n",
            "case.sql:1: syntax error in command \"set\"\n\\set i 1 +\n          ^ error found here",
        ),
        (
            "SELECT 1;\n\\sleep 1 week\n",
            "case.sql:2: unrecognized time unit, must be us, ms or s (week) in command \"sleep\"\n\\sleep 1 week\n         ^ error found here",
        ),
        (
            "\\if\n\\endif\n",
            "case.sql:1: syntax error in command \"if\"\n\\if\n   ^ error found here",
        ),
    ] {
        let e = Script::parse("case.sql", script)
            .expect_err(script)
            .to_string();
        let head: Vec<&str> = e.lines().take(3).collect();
        assert_eq!(head.join("\n"), want, "{e}");
    }
    // pgbench's spellings that must be accepted.
    for ok in [
        "\\sleep 2ms\nSELECT 1;",
        "\\SLEEP 100 US\nSELECT 1;",
        "\\sleep :one ms\nSELECT 1;",
        "\\Set x 1\nSELECT 1;",
    ] {
        Script::parse("s", ok).unwrap_or_else(|e| panic!("{ok:?}: {e}"));
    }
}

#[test]
fn doubles_are_written_with_15_significant_digits() {
    for (d, want) in [
        (0.1 + 0.2, "0.3"),
        (1e30, "1e+30"),
        (1e15, "1e+15"),
        (123456789012345.0, "123456789012345"),
        (0.0001, "0.0001"),
        (0.00001, "1e-05"),
        (-2.5, "-2.5"),
        (f64::NAN, "NaN"),
        (f64::NEG_INFINITY, "-Infinity"),
        (1.0 / 3.0, "0.333333333333333"),
        (2.0 / 3.0, "0.666666666666667"),
    ] {
        assert_eq!(format_g15(d), want, "{d:e}");
    }
    assert_eq!(Value::Double(0.1 + 0.2).to_string(), "0.3");
    assert_eq!(Value::Null.to_string(), "NULL");
    assert_eq!(Value::Bool(true).to_string(), "true");
}

#[test]
fn permute_is_a_permutation() {
    for size in [1, 2, 3, 7, 16, 100, 1000] {
        let mut seen: Vec<i64> = (0..size).map(|v| permute(v, size, 42)).collect();
        seen.sort();
        assert_eq!(seen, (0..size).collect::<Vec<_>>(), "size {size}");
    }
}

/// No input crashes the parser or the evaluator: scripts and expressions
/// generated from pgbench's tokens, and byte-level mutations of valid
/// ones, must parse or fail with an error, and evaluate or fail with an
/// error. Deterministic (seeded), bounded: `PGFLEET_FUZZ_CASES` (default
/// 20,000; .ci/run sets more). A case that ever failed stays in
/// `REGRESSIONS`.
#[test]
fn no_input_crashes_the_parser_or_the_evaluator() {
    const REGRESSIONS: &[&str] = &[
        "-9223372036854775808 / -1",
        "abs(-9223372036854775807 - 1)",
        "1 << -1",
        "permute(-1, 9223372036854775807, -1)",
        "random(-9223372036854775807 - 1, 9223372036854775807)",
        "random_zipfian(1, 9223372036854775807, 1.001)",
        "random_exponential(-9223372036854775807, 9223372036854775807, 1e-300)",
        "int(1e308) + 1",
        "case when when then end",
        "((((((((((1))))))))))",
        "- - - - - 9223372036854775808",
    ];
    const TOKENS: &[&str] = &[
        "1",
        "0",
        "-1",
        "2.5",
        ".5",
        "1e308",
        "9223372036854775807",
        "9223372036854775808",
        ":a",
        ":b",
        ":n",
        ":undefined",
        "(",
        ")",
        ",",
        "+",
        "-",
        "*",
        "/",
        "%",
        "<",
        ">",
        "=",
        "<=",
        ">=",
        "<>",
        "!=",
        "<<",
        ">>",
        "&",
        "|",
        "#",
        "~",
        "and",
        "or",
        "not",
        "is",
        "isnull",
        "notnull",
        "null",
        "true",
        "false",
        "case",
        "when",
        "then",
        "else",
        "end",
        "abs(",
        "debug(",
        "int(",
        "double(",
        "greatest(",
        "least(",
        "pi(",
        "sqrt(",
        "ln(",
        "exp(",
        "pow(",
        "mod(",
        "random(",
        "random_gaussian(",
        "random_exponential(",
        "random_zipfian(",
        "hash(",
        "hash_fnv1a(",
        "permute(",
        ";",
        "'",
        "$",
        "@",
    ];
    let cases: usize = std::env::var("PGFLEET_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let mut rng = pgfleet_proto::script::rng::Rng::seeded(0x5EED);
    let mut vars = Vars::default();
    vars.insert("a".into(), Value::Int(i64::MIN).into());
    vars.insert("b".into(), Value::Double(f64::NAN).into());
    vars.insert("n".into(), Value::Null.into());
    vars.insert("default_seed".into(), Value::Int(1).into());
    let try_expr = |text: &str, rng: &mut pgfleet_proto::script::rng::Rng| {
        if let Ok(e) = parse_expr(text) {
            let mut r = *rng;
            // Zipfian with a huge range and a parameter near 1 may loop
            // long in pgbench too; the evaluator must still not panic.
            let _ = eval(
                &e,
                &mut Env {
                    vars: &vars,
                    rng: &mut r,
                    debug: None,
                },
            );
        }
    };
    for r in REGRESSIONS {
        try_expr(r, &mut rng);
    }
    let seeds: Vec<String> = include_str!("data/pgbench_values.tsv")
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once('\t').map(|x| x.0.to_string()))
        .collect();
    for _ in 0..cases {
        let n = rng.range_u64(1, 12) as usize;
        let text: String = (0..n)
            .map(|_| TOKENS[rng.range_u64(0, TOKENS.len() as u64 - 1) as usize])
            .collect::<Vec<_>>()
            .join(" ");
        try_expr(&text, &mut rng);
        // A valid expression with one byte changed, dropped or repeated.
        let mut bytes = seeds[rng.range_u64(0, seeds.len() as u64 - 1) as usize]
            .clone()
            .into_bytes();
        let at = rng.range_u64(0, bytes.len() as u64 - 1) as usize;
        match rng.range_u64(0, 2) {
            0 => bytes[at] = b" ()+-*/,:;'$\\0a.e9"[rng.range_u64(0, 17) as usize],
            1 => {
                bytes.remove(at);
            }
            _ => bytes.insert(at, bytes[at]),
        }
        let text = String::from_utf8_lossy(&bytes).into_owned();
        try_expr(&text, &mut rng);
        // And as a whole script: meta-commands, SQL, quotes, conditionals.
        let script = format!(
            "\\set x {text}\n\\if {text}\nSELECT :x {}; SELECT $$;\n\\elif 1\n{}\n\\endif\n",
            TOKENS[rng.range_u64(0, TOKENS.len() as u64 - 1) as usize],
            TOKENS[rng.range_u64(0, TOKENS.len() as u64 - 1) as usize],
        );
        let _ = Script::parse("fuzz", &script);
    }
}
