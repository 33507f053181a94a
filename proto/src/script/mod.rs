//! pgbench-compatible scripts: `\set var expr`, `\sleep n [us|ms|s]`, and SQL
//! commands (ending with `;`, possibly over several lines) with `:var`
//! substitution. Expressions follow pgbench's grammar and semantics: integer
//! and double arithmetic (integer overflow and division by zero are errors),
//! comparisons and booleans, bit operators, and pgbench's functions.
//!
//! Errors name the script and line: `random-update:1: unknown function `rnd``.

use std::collections::HashMap;
use std::fmt;

pub mod rng;

use rng::{Rng, hash_fnv1a, hash_murmur2};

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

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    Int(i64),
    Double(f64),
    Bool(bool),
}

impl Value {
    pub fn to_text(self) -> String {
        match self {
            Value::Int(i) => i.to_string(),
            Value::Double(d) => format!("{d}"),
            Value::Bool(b) => b.to_string(),
        }
    }
    fn as_double(self) -> Result<f64, String> {
        match self {
            Value::Int(i) => Ok(i as f64),
            Value::Double(d) => Ok(d),
            Value::Bool(_) => Err("expected a number, got a boolean".into()),
        }
    }
    fn as_int(self) -> Result<i64, String> {
        match self {
            Value::Int(i) => Ok(i),
            Value::Double(d) => {
                if d.is_nan() || d < i64::MIN as f64 || d >= i64::MAX as f64 {
                    Err(format!("double {d} is out of the bigint range"))
                } else {
                    Ok(d as i64)
                }
            }
            Value::Bool(_) => Err("expected an integer, got a boolean".into()),
        }
    }
    fn as_bool(self) -> Result<bool, String> {
        match self {
            Value::Bool(b) => Ok(b),
            Value::Int(i) => Ok(i != 0),
            Value::Double(d) => Ok(d != 0.0),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    Const(Value),
    Var(String),
    Unary(char, Box<Expr>),
    Not(Box<Expr>),
    Binary(BinOp, Box<Expr>, Box<Expr>),
    Call(Func, Vec<Expr>),
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum BinOp {
    Or,
    And,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    BitOr,
    BitXor,
    BitAnd,
    Shl,
    Shr,
    Add,
    Sub,
    Mul,
    Div,
    Mod,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Func {
    Abs,
    Double,
    Int,
    Greatest,
    Least,
    Pi,
    Sqrt,
    Exp,
    Ln,
    Pow,
    Mod,
    Random,
    RandomExponential,
    RandomGaussian,
    RandomZipfian,
    HashMurmur2,
    HashFnv1a,
}

/// (name, function, min args, max args)
const FUNCS: &[(&str, Func, usize, usize)] = &[
    ("abs", Func::Abs, 1, 1),
    ("double", Func::Double, 1, 1),
    ("int", Func::Int, 1, 1),
    ("greatest", Func::Greatest, 1, usize::MAX),
    ("least", Func::Least, 1, usize::MAX),
    ("pi", Func::Pi, 0, 0),
    ("sqrt", Func::Sqrt, 1, 1),
    ("exp", Func::Exp, 1, 1),
    ("ln", Func::Ln, 1, 1),
    ("pow", Func::Pow, 2, 2),
    ("power", Func::Pow, 2, 2),
    ("mod", Func::Mod, 2, 2),
    ("random", Func::Random, 2, 2),
    ("random_exponential", Func::RandomExponential, 3, 3),
    ("random_gaussian", Func::RandomGaussian, 3, 3),
    ("random_zipfian", Func::RandomZipfian, 3, 3),
    ("hash", Func::HashMurmur2, 1, 2),
    ("hash_murmur2", Func::HashMurmur2, 1, 2),
    ("hash_fnv1a", Func::HashFnv1a, 1, 2),
];

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
    let cmd = parts.next().unwrap_or("");
    let rest = parts.next().unwrap_or("").trim();
    match cmd {
        "set" => {
            let mut p = rest.splitn(2, char::is_whitespace);
            let var = p.next().unwrap_or("");
            if !is_var_name(var) {
                return Err(format!("\\set needs a variable name, got `{var}`"));
            }
            let expr_text = p.next().unwrap_or("").trim();
            if expr_text.is_empty() {
                return Err(format!("\\set {var}: missing expression"));
            }
            Ok(Command::Set {
                var: var.into(),
                expr: parse_expr(expr_text)?,
            })
        }
        "sleep" => {
            let mut p = rest.split_whitespace();
            let amount = p.next().ok_or("\\sleep needs a duration")?;
            let unit_us = match p.next() {
                None | Some("s") => 1_000_000,
                Some("ms") => 1_000,
                Some("us") => 1,
                Some(u) => return Err(format!("\\sleep: unknown unit `{u}`: allowed us, ms, s")),
            };
            let amount = if let Some(v) = amount.strip_prefix(':') {
                Expr::Var(v.into())
            } else {
                Expr::Const(Value::Int(
                    amount
                        .parse()
                        .map_err(|_| format!("\\sleep: `{amount}` is not an integer"))?,
                ))
            };
            Ok(Command::Sleep { amount, unit_us })
        }
        other => Err(format!(
            "unsupported meta-command `\\{other}`: supported \\set and \\sleep"
        )),
    }
}

fn is_var_name(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
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

// ---- expressions --------------------------------------------------------

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Int(i64),
    Double(f64),
    Ident(String),
    Var(String),
    Op(&'static str),
    LParen,
    RParen,
    Comma,
}

fn tokenize(s: &str) -> Result<Vec<Tok>, String> {
    const OPS: &[&str] = &[
        "<=", ">=", "<>", "!=", "<<", ">>", "+", "-", "*", "/", "%", "<", ">", "=", "&", "|", "#",
        "~",
    ];
    let c: Vec<char> = s.chars().collect();
    let mut i = 0;
    let mut out = Vec::new();
    'outer: while i < c.len() {
        let ch = c[i];
        if ch.is_whitespace() {
            i += 1;
            continue;
        }
        if ch.is_ascii_digit() || (ch == '.' && c.get(i + 1).is_some_and(|d| d.is_ascii_digit())) {
            let start = i;
            let mut double = false;
            while i < c.len()
                && (c[i].is_ascii_digit()
                    || c[i] == '.'
                    || c[i] == 'e'
                    || c[i] == 'E'
                    || ((c[i] == '+' || c[i] == '-') && (c[i - 1] == 'e' || c[i - 1] == 'E')))
            {
                double |= matches!(c[i], '.' | 'e' | 'E');
                i += 1;
            }
            let text: String = c[start..i].iter().collect();
            out.push(if double {
                Tok::Double(text.parse().map_err(|_| format!("bad number `{text}`"))?)
            } else {
                Tok::Int(
                    text.parse()
                        .map_err(|_| format!("integer `{text}` is out of the bigint range"))?,
                )
            });
            continue;
        }
        if ch == ':' {
            let start = i + 1;
            i = start;
            while i < c.len() && (c[i].is_ascii_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            if i == start {
                return Err("`:` must be followed by a variable name".into());
            }
            out.push(Tok::Var(c[start..i].iter().collect()));
            continue;
        }
        if ch.is_ascii_alphabetic() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_ascii_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            out.push(Tok::Ident(
                c[start..i].iter().collect::<String>().to_ascii_lowercase(),
            ));
            continue;
        }
        match ch {
            '(' => out.push(Tok::LParen),
            ')' => out.push(Tok::RParen),
            ',' => out.push(Tok::Comma),
            _ => {
                for op in OPS {
                    let n = op.len();
                    if c[i..].iter().take(n).collect::<String>() == *op {
                        out.push(Tok::Op(op));
                        i += n;
                        continue 'outer;
                    }
                }
                return Err(format!("unexpected character `{ch}`"));
            }
        }
        i += 1;
    }
    Ok(out)
}

pub fn parse_expr(s: &str) -> Result<Expr, String> {
    let toks = tokenize(s)?;
    let mut p = Parser { toks, pos: 0 };
    let e = p.expr(0)?;
    if p.pos != p.toks.len() {
        return Err(format!("unexpected `{}` in expression", p.describe()));
    }
    Ok(e)
}

struct Parser {
    toks: Vec<Tok>,
    pos: usize,
}

/// Binary operators by precedence level, lowest first (pgbench's exprparse.y).
fn binop(t: &Tok) -> Option<(u8, BinOp)> {
    Some(match t {
        Tok::Ident(s) if s == "or" => (1, BinOp::Or),
        Tok::Ident(s) if s == "and" => (2, BinOp::And),
        Tok::Op("<=") => (4, BinOp::Le),
        Tok::Op(">=") => (4, BinOp::Ge),
        Tok::Op("<>") | Tok::Op("!=") => (4, BinOp::Ne),
        Tok::Op("<") => (5, BinOp::Lt),
        Tok::Op(">") => (5, BinOp::Gt),
        Tok::Op("=") => (5, BinOp::Eq),
        Tok::Op("|") => (6, BinOp::BitOr),
        Tok::Op("#") => (6, BinOp::BitXor),
        Tok::Op("&") => (6, BinOp::BitAnd),
        Tok::Op("<<") => (6, BinOp::Shl),
        Tok::Op(">>") => (6, BinOp::Shr),
        Tok::Op("+") => (7, BinOp::Add),
        Tok::Op("-") => (7, BinOp::Sub),
        Tok::Op("*") => (8, BinOp::Mul),
        Tok::Op("/") => (8, BinOp::Div),
        Tok::Op("%") => (8, BinOp::Mod),
        _ => return None,
    })
}

impl Parser {
    fn describe(&self) -> String {
        match self.toks.get(self.pos) {
            None => "end of expression".into(),
            Some(Tok::Int(i)) => i.to_string(),
            Some(Tok::Double(d)) => d.to_string(),
            Some(Tok::Ident(s)) => s.clone(),
            Some(Tok::Var(v)) => format!(":{v}"),
            Some(Tok::Op(o)) => o.to_string(),
            Some(Tok::LParen) => "(".into(),
            Some(Tok::RParen) => ")".into(),
            Some(Tok::Comma) => ",".into(),
        }
    }

    fn expr(&mut self, min: u8) -> Result<Expr, String> {
        let mut lhs = self.unary()?;
        while let Some((prec, op)) = self.toks.get(self.pos).and_then(binop) {
            if prec < min {
                break;
            }
            self.pos += 1;
            let rhs = self.expr(prec + 1)?;
            lhs = Expr::Binary(op, Box::new(lhs), Box::new(rhs));
        }
        Ok(lhs)
    }

    fn unary(&mut self) -> Result<Expr, String> {
        match self.toks.get(self.pos).cloned() {
            Some(Tok::Op("-")) => {
                self.pos += 1;
                Ok(Expr::Unary('-', Box::new(self.expr(9)?)))
            }
            Some(Tok::Op("+")) => {
                self.pos += 1;
                self.expr(9)
            }
            Some(Tok::Op("~")) => {
                self.pos += 1;
                Ok(Expr::Unary('~', Box::new(self.expr(9)?)))
            }
            Some(Tok::Ident(s)) if s == "not" => {
                self.pos += 1;
                Ok(Expr::Not(Box::new(self.expr(3)?)))
            }
            _ => self.primary(),
        }
    }

    fn primary(&mut self) -> Result<Expr, String> {
        let t = self
            .toks
            .get(self.pos)
            .cloned()
            .ok_or("expression ends too early")?;
        self.pos += 1;
        match t {
            Tok::Int(i) => Ok(Expr::Const(Value::Int(i))),
            Tok::Double(d) => Ok(Expr::Const(Value::Double(d))),
            Tok::Var(v) => Ok(Expr::Var(v)),
            Tok::LParen => {
                let e = self.expr(0)?;
                if self.toks.get(self.pos) != Some(&Tok::RParen) {
                    return Err(format!("expected `)`, got `{}`", self.describe()));
                }
                self.pos += 1;
                Ok(e)
            }
            Tok::Ident(name) => {
                match name.as_str() {
                    "true" => return Ok(Expr::Const(Value::Bool(true))),
                    "false" => return Ok(Expr::Const(Value::Bool(false))),
                    _ => {}
                }
                let Some(&(_, f, min, max)) = FUNCS.iter().find(|(n, ..)| *n == name) else {
                    return Err(format!(
                        "unknown function `{name}`: known {}",
                        FUNCS.iter().map(|f| f.0).collect::<Vec<_>>().join(", ")
                    ));
                };
                if self.toks.get(self.pos) != Some(&Tok::LParen) {
                    return Err(format!("expected `(` after `{name}`"));
                }
                self.pos += 1;
                let mut args = Vec::new();
                if self.toks.get(self.pos) == Some(&Tok::RParen) {
                    self.pos += 1;
                } else {
                    loop {
                        args.push(self.expr(0)?);
                        match self.toks.get(self.pos) {
                            Some(Tok::Comma) => self.pos += 1,
                            Some(Tok::RParen) => {
                                self.pos += 1;
                                break;
                            }
                            _ => {
                                return Err(format!(
                                    "expected `,` or `)` in {name}(), got `{}`",
                                    self.describe()
                                ));
                            }
                        }
                    }
                }
                if args.len() < min || args.len() > max {
                    let want = if min == max {
                        min.to_string()
                    } else if max == usize::MAX {
                        format!("at least {min}")
                    } else {
                        format!("{min} to {max}")
                    };
                    return Err(format!(
                        "{name}() takes {want} arguments, got {}",
                        args.len()
                    ));
                }
                Ok(Expr::Call(f, args))
            }
            other => {
                self.pos -= 1;
                let _ = other;
                Err(format!("unexpected `{}` in expression", self.describe()))
            }
        }
    }
}

/// What expressions see: variables, the client's PRNG, and the hash seed.
/// Script variables. FNV-1a hashing: a transaction looks variables up a
/// few times and the names are short, where SipHash's DoS resistance buys
/// nothing (the names come from the scenario's own script).
pub type Vars = HashMap<String, Value, std::hash::BuildHasherDefault<Fnv>>;

#[derive(Default)]
pub struct Fnv(u64);

impl std::hash::Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        let mut h = if self.0 == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.0
        };
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = h;
    }
}

pub struct Env<'a> {
    pub vars: &'a Vars,
    pub rng: &'a mut Rng,
    pub seed: u64,
}

pub fn eval(e: &Expr, env: &mut Env<'_>) -> Result<Value, String> {
    Ok(match e {
        Expr::Const(v) => *v,
        Expr::Var(v) => *env
            .vars
            .get(v)
            .ok_or_else(|| format!("undefined variable `{v}`"))?,
        Expr::Unary('-', x) => match eval(x, env)? {
            Value::Int(i) => Value::Int(i.checked_neg().ok_or("bigint out of range")?),
            v => Value::Double(-v.as_double()?),
        },
        Expr::Unary(_, x) => Value::Int(!eval(x, env)?.as_int()?),
        Expr::Not(x) => Value::Bool(!eval(x, env)?.as_bool()?),
        Expr::Binary(op, a, b) => {
            // AND/OR short-circuit.
            if let BinOp::And | BinOp::Or = op {
                let l = eval(a, env)?.as_bool()?;
                return Ok(Value::Bool(match op {
                    BinOp::And => l && eval(b, env)?.as_bool()?,
                    _ => l || eval(b, env)?.as_bool()?,
                }));
            }
            binary(*op, eval(a, env)?, eval(b, env)?)?
        }
        Expr::Call(f, args) => call(*f, args, env)?,
    })
}

fn binary(op: BinOp, a: Value, b: Value) -> Result<Value, String> {
    use BinOp::*;
    if let (Value::Int(x), Value::Int(y)) = (a, b) {
        let r = match op {
            Add => x.checked_add(y),
            Sub => x.checked_sub(y),
            Mul => x.checked_mul(y),
            Div | Mod if y == 0 => return Err("division by zero".into()),
            // i64::MIN / -1 overflows; pgbench reports it too.
            Div => x.checked_div(y),
            Mod => Some(if y == -1 { 0 } else { x % y }),
            BitAnd => Some(x & y),
            BitOr => Some(x | y),
            BitXor => Some(x ^ y),
            Shl => Some(x.wrapping_shl(y as u32)),
            Shr => Some(x.wrapping_shr(y as u32)),
            Eq => return Ok(Value::Bool(x == y)),
            Ne => return Ok(Value::Bool(x != y)),
            Lt => return Ok(Value::Bool(x < y)),
            Le => return Ok(Value::Bool(x <= y)),
            Gt => return Ok(Value::Bool(x > y)),
            Ge => return Ok(Value::Bool(x >= y)),
            And | Or => unreachable!("handled by eval"),
        };
        return r
            .map(Value::Int)
            .ok_or_else(|| "bigint out of range".into());
    }
    match op {
        BitAnd | BitOr | BitXor | Shl | Shr | Mod => {
            return binary(op, Value::Int(int_only(a)?), Value::Int(int_only(b)?));
        }
        _ => {}
    }
    let (x, y) = (a.as_double()?, b.as_double()?);
    Ok(match op {
        Add => Value::Double(x + y),
        Sub => Value::Double(x - y),
        Mul => Value::Double(x * y),
        Div => {
            if y == 0.0 {
                return Err("division by zero".into());
            }
            Value::Double(x / y)
        }
        Eq => Value::Bool(x == y),
        Ne => Value::Bool(x != y),
        Lt => Value::Bool(x < y),
        Le => Value::Bool(x <= y),
        Gt => Value::Bool(x > y),
        Ge => Value::Bool(x >= y),
        _ => unreachable!("integer-only and boolean operators handled above"),
    })
}

fn int_only(v: Value) -> Result<i64, String> {
    match v {
        Value::Int(i) => Ok(i),
        _ => Err("this operator takes integers only".into()),
    }
}

fn call(f: Func, args: &[Expr], env: &mut Env<'_>) -> Result<Value, String> {
    let mut vals = Vec::with_capacity(args.len());
    for a in args {
        vals.push(eval(a, env)?);
    }
    let int = |i: usize| vals[i].as_int();
    let dbl = |i: usize| vals[i].as_double();
    Ok(match f {
        Func::Abs => match vals[0] {
            Value::Int(i) => Value::Int(i.checked_abs().ok_or("bigint out of range")?),
            v => Value::Double(v.as_double()?.abs()),
        },
        Func::Double => Value::Double(dbl(0)?),
        Func::Int => Value::Int(int(0)?),
        Func::Greatest | Func::Least => {
            let all_int = vals.iter().all(|v| matches!(v, Value::Int(_)));
            let pick_greatest = f == Func::Greatest;
            if all_int {
                let it = vals.iter().map(|v| v.as_int().unwrap_or(0));
                Value::Int(if pick_greatest { it.max() } else { it.min() }.unwrap_or(0))
            } else {
                let mut best = dbl(0)?;
                for i in 1..vals.len() {
                    let x = dbl(i)?;
                    if (pick_greatest && x > best) || (!pick_greatest && x < best) {
                        best = x;
                    }
                }
                Value::Double(best)
            }
        }
        Func::Pi => Value::Double(std::f64::consts::PI),
        Func::Sqrt => Value::Double(dbl(0)?.sqrt()),
        Func::Exp => Value::Double(dbl(0)?.exp()),
        Func::Ln => Value::Double(dbl(0)?.ln()),
        Func::Pow => Value::Double(dbl(0)?.powf(dbl(1)?)),
        Func::Mod => binary(BinOp::Mod, Value::Int(int(0)?), Value::Int(int(1)?))?,
        Func::Random | Func::RandomExponential | Func::RandomGaussian | Func::RandomZipfian => {
            let (lb, ub) = (int(0)?, int(1)?);
            if lb > ub {
                return Err(format!("empty range given to random: {lb} > {ub}"));
            }
            match f {
                Func::Random => Value::Int(env.rng.uniform(lb, ub)),
                Func::RandomExponential => {
                    let p = dbl(2)?;
                    if p <= 0.0 {
                        return Err(format!(
                            "exponential parameter must be greater than zero (got {p})"
                        ));
                    }
                    Value::Int(env.rng.exponential(lb, ub, p))
                }
                Func::RandomGaussian => {
                    let p = dbl(2)?;
                    if p < 2.0 {
                        return Err(format!("gaussian parameter must be at least 2.0 (got {p})"));
                    }
                    Value::Int(env.rng.gaussian(lb, ub, p))
                }
                _ => {
                    let s = dbl(2)?;
                    if !(1.001..=1000.0).contains(&s) {
                        return Err(format!(
                            "zipfian parameter must be in range [1.001, 1000] (got {s})"
                        ));
                    }
                    Value::Int(env.rng.zipfian(lb, ub, s))
                }
            }
        }
        Func::HashMurmur2 | Func::HashFnv1a => {
            let seed = if vals.len() > 1 {
                int(1)? as u64
            } else {
                env.seed
            };
            let v = int(0)?;
            Value::Int(if f == Func::HashFnv1a {
                hash_fnv1a(v, seed)
            } else {
                hash_murmur2(v, seed)
            })
        }
    })
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
        let mut rng = Rng::seeded(7);
        let mut env = Env {
            vars: &vars,
            rng: &mut rng,
            seed: 0,
        };
        eval(&parse_expr(s)?, &mut env)
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
        assert!(
            ev("9223372036854775807 + 1")
                .unwrap_err()
                .contains("out of range")
        );
        assert!(
            ev(":nope")
                .unwrap_err()
                .contains("undefined variable `nope`")
        );
    }

    #[test]
    fn functions_follow_pgbench() {
        assert_eq!(ev("abs(-5)").unwrap(), Value::Int(5));
        assert_eq!(ev("least(3, 1, 2)").unwrap(), Value::Int(1));
        assert_eq!(ev("greatest(3, 1.5)").unwrap(), Value::Double(3.0));
        assert_eq!(ev("int(5.9)").unwrap(), Value::Int(5));
        assert_eq!(ev("double(2)").unwrap(), Value::Double(2.0));
        assert_eq!(ev("sqrt(16)").unwrap(), Value::Double(4.0));
        assert_eq!(ev("pow(2, 10)").unwrap(), Value::Double(1024.0));
        assert_eq!(ev("mod(10, 3)").unwrap(), Value::Int(1));
        assert_eq!(ev("pi()").unwrap(), Value::Double(std::f64::consts::PI));
        assert_eq!(ev("hash(1)").unwrap(), ev("hash_murmur2(1, 0)").unwrap());
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
                .contains("at least 2.0")
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
                .contains("unknown function `rnd`")
        );
        assert!(ev("random(1)").unwrap_err().contains("takes 2 arguments"));
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
            e.to_string().starts_with("mine:2: unknown function `rnd`"),
            "{e}"
        );
        let e = Script::parse("mine", "\\shell ls\nSELECT 1;").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("mine:1: unsupported meta-command `\\shell`"),
            "{e}"
        );
        let e = Script::parse("mine", "\\set x 1\n").unwrap_err();
        assert!(e.message.contains("no SQL"), "{e}");
        let e = Script::parse("mine", "SELECT 1;\n\\sleep 1 min\n").unwrap_err();
        assert_eq!(e.line, 2);
    }
}
