//! pgbench's expressions (`\set var expr`): its grammar, types and rules.
//!
//! Types are int (i64), double, boolean and NULL. Operators and functions
//! follow pgbench 15: integer arithmetic checks overflow ("bigint add out
//! of range"), a double makes the operation double (so `1.0/0` is
//! Infinity), integer-only operators and `int()` round a double to the
//! nearest even (`rint`), booleans coerce to nothing, any NULL argument
//! makes a function NULL (except `IS` and `debug`), AND/OR evaluate
//! lazily with SQL's NULL rules, CASE takes a condition's truth from any
//! type. Precedence, lowest first: OR, AND, NOT, IS/ISNULL/NOTNULL,
//! comparisons (non-associative), bit operators and unary `~`, `+ -`,
//! `* / %`, unary `+ -`. Keywords and function names are case-insensitive.
//! Values reach SQL as pgbench writes them: doubles with 15 significant
//! digits (`%.15g`), booleans `true`/`false`, NULL as `NULL`.

use std::collections::HashMap;
use std::fmt;

use super::rng::{Rng, hash_fnv1a, hash_murmur2, permute};

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    Null,
    Int(i64),
    Double(f64),
    Bool(bool),
}

/// pgbench's maximum number of arguments of a function.
pub const MAX_FUNCTION_ARGS: usize = 16;

impl fmt::Display for Value {
    /// The text pgbench substitutes for a variable in SQL.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Null => f.write_str("NULL"),
            Value::Int(i) => write!(f, "{i}"),
            Value::Double(d) => f.write_str(&format_g15(*d)),
            Value::Bool(b) => f.write_str(if *b { "true" } else { "false" }),
        }
    }
}

impl Value {
    /// What pgbench's `debug()` prints: `int 5`, `double 0.3`,
    /// `boolean true`, `null`.
    pub fn debug_text(self) -> String {
        match self {
            Value::Null => "null".into(),
            Value::Int(i) => format!("int {i}"),
            Value::Double(d) => format!("double {}", format_g15(d)),
            Value::Bool(b) => format!("boolean {b}"),
        }
    }

    fn type_name(self) -> &'static str {
        match self {
            Value::Null => "NULL",
            Value::Int(_) => "int",
            Value::Double(_) => "double",
            Value::Bool(_) => "boolean",
        }
    }

    /// `coerceToInt`: a double is rounded to the nearest (ties to even).
    pub fn as_int(self) -> Result<i64, String> {
        match self {
            Value::Int(i) => Ok(i),
            Value::Double(d) => {
                let r = d.round_ties_even();
                if r.is_nan() || !(-9.223_372_036_854_776e18..9.223_372_036_854_776e18).contains(&r)
                {
                    Err(format!("double to int overflow for {d:.6}"))
                } else {
                    Ok(r as i64)
                }
            }
            other => Err(format!("cannot coerce {} to int", other.type_name())),
        }
    }

    /// `coerceToDouble`.
    pub fn as_double(self) -> Result<f64, String> {
        match self {
            Value::Int(i) => Ok(i as f64),
            Value::Double(d) => Ok(d),
            other => Err(format!("cannot coerce {} to double", other.type_name())),
        }
    }

    /// `coerceToBool`: booleans only.
    pub fn as_bool(self) -> Result<bool, String> {
        match self {
            Value::Bool(b) => Ok(b),
            other => Err(format!("cannot coerce {} to boolean", other.type_name())),
        }
    }

    /// `valueTruth`: a condition's truth (CASE WHEN, \if).
    pub fn truth(self) -> bool {
        match self {
            Value::Null => false,
            Value::Bool(b) => b,
            Value::Int(i) => i != 0,
            Value::Double(d) => d != 0.0,
        }
    }

    /// A variable's text as pgbench reads it (`-D`, `\gset`, `\setshell`):
    /// `null`, a boolean spelling, an integer, a double; else malformed.
    pub fn parse_text(name: &str, text: &str) -> Result<Value, String> {
        let t = text.trim();
        let lower = t.to_ascii_lowercase();
        let prefix_of = |word: &str, min: usize| lower.len() >= min && word.starts_with(&lower);
        if lower == "null" {
            return Ok(Value::Null);
        }
        if prefix_of("true", 1) || prefix_of("yes", 1) || prefix_of("on", 2) {
            return Ok(Value::Bool(true));
        }
        if prefix_of("false", 1) || prefix_of("no", 1) || prefix_of("off", 2) {
            return Ok(Value::Bool(false));
        }
        let digits = t.strip_prefix(['+', '-']).unwrap_or(t);
        if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
            return t
                .trim_start_matches('+')
                .parse::<i64>()
                .map(Value::Int)
                .map_err(|_| format!("value \"{t}\" is out of range for type bigint"));
        }
        match t.parse::<f64>() {
            Ok(d) if d.is_finite() || lower.contains("inf") || lower.contains("nan") => {
                Ok(Value::Double(d))
            }
            _ => Err(format!("malformed variable \"{name}\" value: \"{text}\"")),
        }
    }
}

/// C's `%.15g` as PostgreSQL's snprintf writes it (`Infinity`, `NaN`).
pub fn format_g15(d: f64) -> String {
    const P: i32 = 15;
    if d.is_nan() {
        return "NaN".into();
    }
    if d.is_infinite() {
        return if d > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    if d == 0.0 {
        return if d.is_sign_negative() { "-0" } else { "0" }.into();
    }
    let e = format!("{:.*e}", (P - 1) as usize, d);
    let (mantissa, exp) = e.split_once('e').unwrap_or((&e, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let strip = |s: &str| -> String {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s.to_string()
        }
    };
    if !(-4..P).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", strip(mantissa), exp.abs())
    } else {
        strip(&format!("{:.*}", (P - 1 - exp) as usize, d))
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    Const(Value),
    Var(String),
    Not(Box<Expr>),
    Binary(BinOp, Box<Expr>, Box<Expr>),
    /// `x IS NULL`, `x IS TRUE`, `x IS FALSE` (the value is NULL or a boolean).
    Is(Box<Expr>, Value),
    /// WHEN/THEN pairs and the ELSE (NULL when absent).
    Case(Vec<(Expr, Expr)>, Box<Expr>),
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
    Debug,
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
    Permute,
}

/// (name, function, min args, max args); pgbench's table.
const FUNCS: &[(&str, Func, usize, usize)] = &[
    ("abs", Func::Abs, 1, 1),
    ("debug", Func::Debug, 1, 1),
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
    ("permute", Func::Permute, 2, 3),
];

// ---- tokens ---------------------------------------------------------------

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Int(i64),
    /// 9223372036854775808: only valid right after a unary minus.
    MaxIntPlusOne,
    Double(f64),
    Word(String),
    Var(String),
    Op(&'static str),
    LParen,
    RParen,
    Comma,
}

/// A syntax error at a byte offset of the expression: pgbench's message
/// (`syntax error`, `unexpected function name (f)`, ...) and what more
/// pgfleet can say.
#[derive(Debug, Clone, PartialEq)]
pub struct ExprError {
    pub message: String,
    pub at: usize,
    pub hint: Option<String>,
}

impl fmt::Display for ExprError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at column {}", self.message, self.at + 1)?;
        match &self.hint {
            Some(h) => write!(f, " ({h})"),
            None => Ok(()),
        }
    }
}

fn tokenize(s: &str) -> Result<Vec<(Tok, usize)>, ExprError> {
    const OPS: &[&str] = &[
        "<=", ">=", "<>", "!=", "<<", ">>", "+", "-", "*", "/", "%", "<", ">", "=", "&", "|", "#",
        "~",
    ];
    let b = s.as_bytes();
    let mut i = 0;
    let mut out = Vec::new();
    let err = |message: String, at: usize| ExprError {
        message,
        at,
        hint: None,
    };
    'outer: while i < b.len() {
        let ch = b[i];
        let start = i;
        if ch.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        if ch.is_ascii_digit() || (ch == b'.' && b.get(i + 1).is_some_and(u8::is_ascii_digit)) {
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1;
            }
            let mut double = false;
            if i < b.len() && b[i] == b'.' {
                double = true;
                i += 1;
                while i < b.len() && b[i].is_ascii_digit() {
                    i += 1;
                }
            }
            if i < b.len() && (b[i] == b'e' || b[i] == b'E') {
                let mut j = i + 1;
                if j < b.len() && (b[j] == b'+' || b[j] == b'-') {
                    j += 1;
                }
                if j < b.len() && b[j].is_ascii_digit() {
                    while j < b.len() && b[j].is_ascii_digit() {
                        j += 1;
                    }
                    double = true;
                    i = j;
                }
            }
            let text = &s[start..i];
            let tok = if double {
                match text.parse::<f64>() {
                    Ok(d) if d.is_finite() => Tok::Double(d),
                    _ => return Err(err(format!("double constant overflow ({text})"), start)),
                }
            } else if text.trim_start_matches('0') == "9223372036854775808" {
                Tok::MaxIntPlusOne
            } else {
                Tok::Int(
                    text.parse()
                        .map_err(|_| err(format!("bigint constant overflow ({text})"), start))?,
                )
            };
            out.push((tok, start));
            continue;
        }
        if ch == b':' {
            i += 1;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] >= 0x80) {
                i += 1;
            }
            if i == start + 1 {
                return Err(err("`:` must be followed by a variable name".into(), start));
            }
            out.push((Tok::Var(s[start + 1..i].to_string()), start));
            continue;
        }
        if ch.is_ascii_alphabetic() || ch == b'_' || ch >= 0x80 {
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] >= 0x80) {
                i += 1;
            }
            out.push((Tok::Word(s[start..i].to_ascii_lowercase()), start));
            continue;
        }
        let single = match ch {
            b'(' => Some(Tok::LParen),
            b')' => Some(Tok::RParen),
            b',' => Some(Tok::Comma),
            _ => None,
        };
        if let Some(t) = single {
            out.push((t, start));
            i += 1;
            continue;
        }
        for op in OPS {
            if s[i..].starts_with(op) {
                out.push((Tok::Op(op), start));
                i += op.len();
                continue 'outer;
            }
        }
        let c = s[i..].chars().next().unwrap_or('?');
        return Err(err(format!("unexpected character ({c})"), start));
    }
    Ok(out)
}

// ---- parser -----------------------------------------------------------------

/// Precedence levels, lowest first (pgbench's exprparse.y).
const OR: u8 = 1;
const AND: u8 = 2;
const NOT: u8 = 3;
const IS: u8 = 4;
const CMP: u8 = 5;
const BIT: u8 = 6;
const ADD: u8 = 7;
const MUL: u8 = 8;
const UNARY: u8 = 10;

fn binop(t: &Tok) -> Option<(u8, BinOp)> {
    Some(match t {
        Tok::Word(s) if s == "or" => (OR, BinOp::Or),
        Tok::Word(s) if s == "and" => (AND, BinOp::And),
        Tok::Op("<=") => (CMP, BinOp::Le),
        Tok::Op(">=") => (CMP, BinOp::Ge),
        Tok::Op("<>") | Tok::Op("!=") => (CMP, BinOp::Ne),
        Tok::Op("<") => (CMP, BinOp::Lt),
        Tok::Op(">") => (CMP, BinOp::Gt),
        Tok::Op("=") => (CMP, BinOp::Eq),
        Tok::Op("|") => (BIT, BinOp::BitOr),
        Tok::Op("#") => (BIT, BinOp::BitXor),
        Tok::Op("&") => (BIT, BinOp::BitAnd),
        Tok::Op("<<") => (BIT, BinOp::Shl),
        Tok::Op(">>") => (BIT, BinOp::Shr),
        Tok::Op("+") => (ADD, BinOp::Add),
        Tok::Op("-") => (ADD, BinOp::Sub),
        Tok::Op("*") => (MUL, BinOp::Mul),
        Tok::Op("/") => (MUL, BinOp::Div),
        Tok::Op("%") => (MUL, BinOp::Mod),
        _ => return None,
    })
}

/// How tall an expression's tree may be (a chain `a + b + …` is as tall
/// as it is long). The evaluator recurses over the tree, so without a
/// bound a long chain would overflow a thread's stack and abort the
/// process (`validate`, `serve`'s handlers, the agent). pgbench's bison
/// parser stops at its own stack limit.
pub const MAX_EXPR_DEPTH: usize = 256;

/// How deeply the parser may nest (parentheses, unary operators, CASE,
/// function arguments): each level is several of its frames. Real scripts
/// stay under a dozen.
pub const MAX_EXPR_NESTING: usize = 100;

/// Parses an expression; a syntax error says where.
pub fn parse_expr(s: &str) -> Result<Expr, ExprError> {
    let toks = tokenize(s)?;
    let mut p = Parser {
        toks,
        pos: 0,
        len: s.len(),
        nesting: 0,
    };
    let (e, _) = p.expr(0)?;
    if p.pos != p.toks.len() {
        return Err(p.error("syntax error"));
    }
    Ok(e)
}

struct Parser {
    toks: Vec<(Tok, usize)>,
    pos: usize,
    len: usize,
    /// How many `expr` calls are open (bounded by `MAX_EXPR_DEPTH`).
    nesting: usize,
}

/// A parsed expression and its tree's height.
type Node = (Expr, usize);

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos).map(|t| &t.0)
    }

    fn is_word(&self, w: &str) -> bool {
        matches!(self.peek(), Some(Tok::Word(x)) if x == w)
    }

    fn error(&self, what: &str) -> ExprError {
        let at = self.toks.get(self.pos).map_or(self.len, |t| t.1);
        let near = match self.peek() {
            None => "end of expression".to_string(),
            Some(Tok::Int(i)) => i.to_string(),
            Some(Tok::MaxIntPlusOne) => "9223372036854775808".into(),
            Some(Tok::Double(d)) => format_g15(*d),
            Some(Tok::Word(s)) => s.clone(),
            Some(Tok::Var(v)) => format!(":{v}"),
            Some(Tok::Op(o)) => o.to_string(),
            Some(Tok::LParen) => "(".into(),
            Some(Tok::RParen) => ")".into(),
            Some(Tok::Comma) => ",".into(),
        };
        let hint = match what.strip_prefix("syntax error: ") {
            Some(h) => format!("{h}, at or near \"{near}\""),
            None => format!("at or near \"{near}\""),
        };
        ExprError {
            message: "syntax error".into(),
            at,
            hint: Some(hint),
        }
    }

    /// A node of height `h`, refused past `MAX_EXPR_DEPTH`.
    fn node(&self, e: Expr, h: usize) -> Result<Node, ExprError> {
        if h > MAX_EXPR_DEPTH {
            return Err(self.too_deep());
        }
        Ok((e, h))
    }

    fn too_deep(&self) -> ExprError {
        ExprError {
            message: "expression is too deeply nested".into(),
            at: self.toks.get(self.pos).map_or(self.len, |t| t.1),
            hint: Some(format!(
                "at most {MAX_EXPR_NESTING} levels of parentheses, unary operators and calls, and {MAX_EXPR_DEPTH} operators in a chain; split it over several \\set commands"
            )),
        }
    }

    fn expect_word(&mut self, w: &str) -> Result<(), ExprError> {
        if self.is_word(w) {
            self.pos += 1;
            Ok(())
        } else {
            Err(self.error(&format!("syntax error: expected {}", w.to_uppercase())))
        }
    }

    fn expr(&mut self, min: u8) -> Result<Node, ExprError> {
        if self.nesting >= MAX_EXPR_NESTING {
            return Err(self.too_deep());
        }
        self.nesting += 1;
        let e = self.expr_inner(min);
        self.nesting -= 1;
        e
    }

    fn expr_inner(&mut self, min: u8) -> Result<Node, ExprError> {
        let mut lhs = self.prefix()?;
        // Non-associative levels take one operator each.
        let mut seen_is = false;
        let mut seen_cmp = false;
        loop {
            if IS >= min
                && (self.is_word("is") || self.is_word("isnull") || self.is_word("notnull"))
            {
                if seen_is {
                    return Err(self.error("syntax error"));
                }
                seen_is = true;
                lhs = self.postfix_is(lhs)?;
                continue;
            }
            let Some((prec, op)) = self.peek().and_then(binop) else {
                break;
            };
            if prec < min {
                break;
            }
            if prec == CMP {
                if seen_cmp {
                    return Err(self.error("syntax error"));
                }
                seen_cmp = true;
            }
            self.pos += 1;
            let (rhs, rh) = self.expr(prec + 1)?;
            let h = 1 + lhs.1.max(rh);
            lhs = self.node(Expr::Binary(op, Box::new(lhs.0), Box::new(rhs)), h)?;
        }
        Ok(lhs)
    }

    fn postfix_is(&mut self, (lhs, h): Node) -> Result<Node, ExprError> {
        let word = match self.peek() {
            Some(Tok::Word(w)) => w.clone(),
            _ => return Err(self.error("syntax error")),
        };
        self.pos += 1;
        let is = |v| Expr::Is(Box::new(lhs.clone()), v);
        match word.as_str() {
            "isnull" => self.node(is(Value::Null), h + 1),
            "notnull" => self.node(Expr::Not(Box::new(is(Value::Null))), h + 2),
            _ => {
                let negated = self.is_word("not");
                if negated {
                    self.pos += 1;
                }
                let v = match self.peek() {
                    Some(Tok::Word(w)) if w == "null" => Value::Null,
                    Some(Tok::Word(w)) if w == "true" => Value::Bool(true),
                    Some(Tok::Word(w)) if w == "false" => Value::Bool(false),
                    _ => return Err(self.error("syntax error: expected NULL, TRUE or FALSE")),
                };
                self.pos += 1;
                if negated {
                    self.node(Expr::Not(Box::new(is(v))), h + 2)
                } else {
                    self.node(is(v), h + 1)
                }
            }
        }
    }

    fn prefix(&mut self) -> Result<Node, ExprError> {
        match self.peek().cloned() {
            Some(Tok::Op("-")) => {
                self.pos += 1;
                if self.peek() == Some(&Tok::MaxIntPlusOne) {
                    self.pos += 1;
                    return Ok((Expr::Const(Value::Int(i64::MIN)), 1));
                }
                // pgbench: "-x" is "0 - x".
                let (x, h) = self.expr(UNARY)?;
                self.node(
                    Expr::Binary(
                        BinOp::Sub,
                        Box::new(Expr::Const(Value::Int(0))),
                        Box::new(x),
                    ),
                    h + 1,
                )
            }
            Some(Tok::Op("+")) => {
                self.pos += 1;
                self.expr(UNARY)
            }
            Some(Tok::Op("~")) => {
                // "~x" is "0xffff... # x", at the bit operators' level.
                self.pos += 1;
                let (x, h) = self.expr(BIT + 1)?;
                self.node(
                    Expr::Binary(
                        BinOp::BitXor,
                        Box::new(Expr::Const(Value::Int(-1))),
                        Box::new(x),
                    ),
                    h + 1,
                )
            }
            Some(Tok::Word(w)) if w == "not" => {
                self.pos += 1;
                let (x, h) = self.expr(NOT + 1)?;
                self.node(Expr::Not(Box::new(x)), h + 1)
            }
            Some(Tok::Word(w)) if w == "case" => {
                self.pos += 1;
                let mut whens = Vec::new();
                let mut h = 1;
                while self.is_word("when") {
                    self.pos += 1;
                    let (cond, ch) = self.expr(0)?;
                    self.expect_word("then")?;
                    let (then, th) = self.expr(0)?;
                    h = h.max(ch).max(th);
                    whens.push((cond, then));
                }
                if whens.is_empty() {
                    return Err(self.error("syntax error: expected WHEN"));
                }
                let otherwise = if self.is_word("else") {
                    self.pos += 1;
                    let (e, eh) = self.expr(0)?;
                    h = h.max(eh);
                    e
                } else {
                    Expr::Const(Value::Null)
                };
                self.expect_word("end")?;
                self.node(Expr::Case(whens, Box::new(otherwise)), h + 1)
            }
            _ => self.primary(),
        }
    }

    fn primary(&mut self) -> Result<Node, ExprError> {
        let Some(t) = self.peek().cloned() else {
            return Err(self.error("syntax error"));
        };
        match t {
            Tok::Int(i) => {
                self.pos += 1;
                Ok((Expr::Const(Value::Int(i)), 1))
            }
            Tok::Double(d) => {
                self.pos += 1;
                Ok((Expr::Const(Value::Double(d)), 1))
            }
            Tok::Var(v) => {
                self.pos += 1;
                Ok((Expr::Var(v), 1))
            }
            Tok::LParen => {
                self.pos += 1;
                let e = self.expr(0)?;
                if self.peek() != Some(&Tok::RParen) {
                    return Err(self.error("syntax error: expected \")\""));
                }
                self.pos += 1;
                Ok(e)
            }
            Tok::Word(name) => {
                match name.as_str() {
                    "null" => {
                        self.pos += 1;
                        return Ok((Expr::Const(Value::Null), 1));
                    }
                    "true" | "false" => {
                        self.pos += 1;
                        return Ok((Expr::Const(Value::Bool(name == "true")), 1));
                    }
                    "and" | "or" | "not" | "is" | "isnull" | "notnull" | "case" | "when"
                    | "then" | "else" | "end" => return Err(self.error("syntax error")),
                    _ => {}
                }
                let Some(&(_, f, min, max)) = FUNCS.iter().find(|(n, ..)| *n == name) else {
                    return Err(ExprError {
                        message: format!("unexpected function name ({name})"),
                        at: self.toks[self.pos].1,
                        hint: Some(format!(
                            "pgbench's functions are {}",
                            FUNCS.iter().map(|f| f.0).collect::<Vec<_>>().join(", ")
                        )),
                    });
                };
                let at = self.toks[self.pos].1;
                self.pos += 1;
                if self.peek() != Some(&Tok::LParen) {
                    return Err(self.error(&format!("syntax error: expected \"(\" after {name}")));
                }
                self.pos += 1;
                let mut args = Vec::new();
                let mut h = 1;
                if self.peek() == Some(&Tok::RParen) {
                    self.pos += 1;
                } else {
                    loop {
                        let (a, ah) = self.expr(0)?;
                        h = h.max(ah);
                        args.push(a);
                        match self.peek() {
                            Some(Tok::Comma) => self.pos += 1,
                            Some(Tok::RParen) => {
                                self.pos += 1;
                                break;
                            }
                            _ => return Err(self.error("syntax error")),
                        }
                    }
                }
                if args.len() < min || args.len() > max {
                    let (message, hint) = if max == usize::MAX {
                        (format!("at least one argument expected ({name})"), None)
                    } else {
                        let want = if min == max {
                            min.to_string()
                        } else {
                            format!("{min} to {max}")
                        };
                        (
                            format!("unexpected number of arguments ({name})"),
                            Some(format!("{} given, {want} expected", args.len())),
                        )
                    };
                    return Err(ExprError { message, at, hint });
                }
                // Hashes and permute without a seed take :default_seed.
                if matches!(f, Func::HashMurmur2 | Func::HashFnv1a) && args.len() == 1
                    || f == Func::Permute && args.len() == 2
                {
                    args.push(Expr::Var("default_seed".into()));
                }
                self.node(Expr::Call(f, args), h + 1)
            }
            _ => Err(self.error("syntax error")),
        }
    }
}

// ---- evaluation -------------------------------------------------------------

/// A script variable as pgbench keeps it: a value an expression computed,
/// or text from outside (`defines`, `\gset`, `\aset`), kept as it came
/// (SQL receives it unchanged) and read as a value only when an
/// expression uses it, where text that is not one is "malformed".
#[derive(Debug, Clone, PartialEq)]
pub enum Var {
    Value(Value),
    Text(Box<str>),
}

impl Var {
    /// The variable's value in an expression (`name` for the error).
    pub fn value(&self, name: &str) -> Result<Value, String> {
        match self {
            Var::Value(v) => Ok(*v),
            Var::Text(t) => Value::parse_text(name, t),
        }
    }
}

impl From<Value> for Var {
    fn from(v: Value) -> Var {
        Var::Value(v)
    }
}

impl fmt::Display for Var {
    /// The text substituted into SQL: text as it came, values as pgbench
    /// writes them.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Var::Value(v) => v.fmt(f),
            Var::Text(t) => f.write_str(t),
        }
    }
}

/// Script variables. FNV-1a hashing: a transaction looks variables up a
/// few times and the names are short, where SipHash's DoS resistance buys
/// nothing (the names come from the scenario's own script).
pub type Vars = HashMap<String, Var, std::hash::BuildHasherDefault<Fnv>>;

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

/// What expressions see: variables, the client's generator, and where
/// `debug()` values go (none: dropped).
pub struct Env<'a> {
    pub vars: &'a Vars,
    pub rng: &'a mut Rng,
    pub debug: Option<&'a mut Vec<Value>>,
}

pub fn eval(e: &Expr, env: &mut Env<'_>) -> Result<Value, String> {
    Ok(match e {
        Expr::Const(v) => *v,
        Expr::Var(v) => env
            .vars
            .get(v)
            .ok_or_else(|| format!("undefined variable \"{v}\""))?
            .value(v)?,
        Expr::Not(x) => match eval(x, env)? {
            Value::Null => Value::Null,
            v => Value::Bool(!v.as_bool()?),
        },
        Expr::Is(x, want) => {
            let v = eval(x, env)?;
            Value::Bool(match (v, want) {
                (Value::Null, Value::Null) => true,
                (Value::Bool(a), Value::Bool(b)) => a == *b,
                _ => false,
            })
        }
        Expr::Case(whens, otherwise) => {
            for (cond, then) in whens {
                if eval(cond, env)?.truth() {
                    return eval(then, env);
                }
            }
            eval(otherwise, env)?
        }
        Expr::Binary(op @ (BinOp::And | BinOp::Or), a, b) => {
            // Lazy, with NULL as pgbench has it: a NULL left side is NULL.
            let l = match eval(a, env)? {
                Value::Null => return Ok(Value::Null),
                v => v.as_bool()?,
            };
            if (*op == BinOp::And) != l {
                return Ok(Value::Bool(l));
            }
            match eval(b, env)? {
                Value::Null => Value::Null,
                v => Value::Bool(v.as_bool()?),
            }
        }
        Expr::Binary(op, a, b) => {
            let (x, y) = (eval(a, env)?, eval(b, env)?);
            if x == Value::Null || y == Value::Null {
                return Ok(Value::Null);
            }
            binary(*op, x, y)?
        }
        Expr::Call(f, args) => call(*f, args, env)?,
    })
}

fn binary(op: BinOp, a: Value, b: Value) -> Result<Value, String> {
    use BinOp::*;
    let doubles = matches!(a, Value::Double(_)) || matches!(b, Value::Double(_));
    match op {
        Add | Sub | Mul | Div | Eq | Ne | Lt | Le | Gt | Ge if doubles => {
            let (x, y) = (a.as_double()?, b.as_double()?);
            Ok(match op {
                Add => Value::Double(x + y),
                Sub => Value::Double(x - y),
                Mul => Value::Double(x * y),
                Div => Value::Double(x / y),
                Eq => Value::Bool(x == y),
                Ne => Value::Bool(x != y),
                Lt => Value::Bool(x < y),
                Le => Value::Bool(x <= y),
                Gt => Value::Bool(x > y),
                _ => Value::Bool(x >= y),
            })
        }
        _ => {
            let (x, y) = (a.as_int()?, b.as_int()?);
            let out = |r: Option<i64>, what: &str| {
                r.map(Value::Int)
                    .ok_or_else(|| format!("bigint {what} out of range"))
            };
            match op {
                Add => out(x.checked_add(y), "add"),
                Sub => out(x.checked_sub(y), "sub"),
                Mul => out(x.checked_mul(y), "mul"),
                Div | Mod if y == 0 => Err("division by zero".into()),
                Div => out(x.checked_div(y), "div"),
                Mod => Ok(Value::Int(if y == -1 { 0 } else { x % y })),
                BitAnd => Ok(Value::Int(x & y)),
                BitOr => Ok(Value::Int(x | y)),
                BitXor => Ok(Value::Int(x ^ y)),
                Shl => Ok(Value::Int(x.wrapping_shl(y as u32))),
                Shr => Ok(Value::Int(x.wrapping_shr(y as u32))),
                Eq => Ok(Value::Bool(x == y)),
                Ne => Ok(Value::Bool(x != y)),
                Lt => Ok(Value::Bool(x < y)),
                Le => Ok(Value::Bool(x <= y)),
                Gt => Ok(Value::Bool(x > y)),
                Ge => Ok(Value::Bool(x >= y)),
                And | Or => unreachable!("AND and OR are lazy, in eval"),
            }
        }
    }
}

fn call(f: Func, args: &[Expr], env: &mut Env<'_>) -> Result<Value, String> {
    // pgbench refuses these when it evaluates them.
    if args.len() > MAX_FUNCTION_ARGS {
        return Err(format!(
            "too many function arguments, maximum is {MAX_FUNCTION_ARGS}"
        ));
    }
    let mut vals = [Value::Null; MAX_FUNCTION_ARGS];
    for (slot, a) in vals.iter_mut().zip(args) {
        *slot = eval(a, env)?;
    }
    let vals = &vals[..args.len()];
    if f == Func::Debug {
        if let Some(d) = env.debug.as_deref_mut() {
            d.push(vals[0]);
        }
        return Ok(vals[0]);
    }
    if vals.contains(&Value::Null) {
        return Ok(Value::Null);
    }
    let int = |i: usize| vals[i].as_int();
    let dbl = |i: usize| vals[i].as_double();
    Ok(match f {
        Func::Abs => match vals[0] {
            Value::Int(i) => Value::Int(i.wrapping_abs()),
            v => Value::Double(v.as_double()?.abs()),
        },
        Func::Double => Value::Double(dbl(0)?),
        Func::Int => Value::Int(int(0)?),
        Func::Greatest | Func::Least => {
            let greatest = f == Func::Greatest;
            if vals.iter().any(|v| matches!(v, Value::Double(_))) {
                let mut best = dbl(0)?;
                for i in 1..vals.len() {
                    let x = dbl(i)?;
                    if (greatest && x > best) || (!greatest && x < best) {
                        best = x;
                    }
                }
                Value::Double(best)
            } else {
                let mut best = int(0)?;
                for i in 1..vals.len() {
                    let x = int(i)?;
                    if (greatest && x > best) || (!greatest && x < best) {
                        best = x;
                    }
                }
                Value::Int(best)
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
                return Err("empty range given to random".into());
            }
            let span = ub.wrapping_sub(lb);
            if span < 0 || span.wrapping_add(1) < 0 {
                return Err("random range is too large".into());
            }
            match f {
                Func::Random => Value::Int(env.rng.uniform(lb, ub)),
                Func::RandomExponential => {
                    let p = dbl(2)?;
                    if p <= 0.0 {
                        return Err(format!(
                            "exponential parameter must be greater than zero (got {p:.6})"
                        ));
                    }
                    Value::Int(env.rng.exponential(lb, ub, p))
                }
                Func::RandomGaussian => {
                    let p = dbl(2)?;
                    if p < 2.0 {
                        return Err(format!(
                            "gaussian parameter must be at least 2.000000 (got {p:.6})"
                        ));
                    }
                    Value::Int(env.rng.gaussian(lb, ub, p))
                }
                _ => {
                    let s = dbl(2)?;
                    if !(1.001..=1000.0).contains(&s) {
                        return Err(format!(
                            "zipfian parameter must be in range [1.001, 1000] (got {s:.6})"
                        ));
                    }
                    Value::Int(env.rng.zipfian(lb, ub, s))
                }
            }
        }
        Func::HashMurmur2 => Value::Int(hash_murmur2(int(0)?, int(1)? as u64)),
        Func::HashFnv1a => Value::Int(hash_fnv1a(int(0)?, int(1)? as u64)),
        Func::Permute => {
            let (v, size, seed) = (int(0)?, int(1)?, int(2)?);
            if size <= 0 {
                return Err("permute size parameter must be greater than zero".into());
            }
            Value::Int(permute(v, size, seed))
        }
        Func::Debug => unreachable!("debug returns its argument above"),
    })
}
