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

pub use expr::{
    BinOp, Env, Expr, Func, MAX_EXPR_DEPTH, MAX_EXPR_NESTING, Value, Var, Vars, eval, format_g15,
    parse_expr,
};

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

/// A script pgbench would refuse, reported as pgbench reports it: the
/// script and line, pgbench's message, then the command's text and a
/// caret under the position where there is one.
#[derive(Debug, Clone, PartialEq)]
pub struct ScriptError {
    pub script: String,
    pub line: usize,
    pub message: String,
    /// The meta-command's text, and the byte column of the error in it.
    pub text: Option<String>,
    pub column: Option<usize>,
    /// What more pgfleet can say (what it expected, the valid names).
    pub hint: Option<String>,
}

impl fmt::Display for ScriptError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.script, self.line, self.message)?;
        if let Some(t) = &self.text {
            write!(f, "\n{t}")?;
            if let Some(c) = self.column {
                write!(f, "\n{:c$}^ error found here", "")?;
            }
        }
        match &self.hint {
            Some(h) => write!(f, "\n{h}"),
            None => Ok(()),
        }
    }
}

/// A meta-command's error: pgbench's message, and where in the line.
#[derive(Debug)]
struct MetaError {
    message: String,
    column: Option<usize>,
    hint: Option<String>,
}

impl From<String> for MetaError {
    fn from(message: String) -> MetaError {
        MetaError {
            message,
            column: None,
            hint: None,
        }
    }
}

impl From<&str> for MetaError {
    fn from(message: &str) -> MetaError {
        message.to_string().into()
    }
}

impl MetaError {
    /// An expression's error in command `cmd`, the expression starting
    /// at byte `offset` of the line.
    fn expr(e: expr::ExprError, cmd: &str, offset: usize) -> MetaError {
        MetaError {
            message: format!("{} in command \"{cmd}\"", e.message),
            column: Some(offset + e.at),
            hint: e.hint,
        }
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
    /// `\if cond`: on false, execution enters command `next` (the chain's
    /// next `\elif`, its `\else` or its `\endif`).
    If {
        cond: Expr,
        next: usize,
    },
    /// `\elif cond`: entered from a false branch, it tests `cond`; reached
    /// at the end of a taken branch, it goes past `end` (the `\endif`).
    Elif {
        cond: Expr,
        next: usize,
        end: usize,
    },
    Else {
        end: usize,
    },
    Endif,
    /// `\shell` (no `var`) or `\setshell var`: the words joined by spaces
    /// run by `/bin/sh -c`; a word `:name` is the variable's text, `::x`
    /// is `:x`. Runs on the agent's host: only with `allow_shell`.
    Shell {
        var: Option<String>,
        args: Vec<String>,
    },
    /// A command pgbench accepts in a script but fails when it runs
    /// (`\set . 1`: a variable name it checks only on assignment).
    Fail(String),
    /// `\startpipeline`, `\syncpipeline`, `\endpipeline`: SQL between
    /// them is sent without waiting, replies read at the end.
    Pipeline(PipelineOp),
    /// SQL with `:var` replaced by `$1..$n`; `params[i]` is the variable of
    /// `$i+1`. A compound command (statements joined by `\;`) keeps its
    /// `:var`s, substituted as text and sent by the simple protocol, as
    /// pgbench's simple mode does.
    Sql {
        sql: String,
        params: Vec<String>,
        compound: bool,
        /// `\gset` / `\aset` after it: where its row goes.
        store: Option<Store>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PipelineOp {
    Start,
    Sync,
    End,
}

/// `\gset [prefix]` (the one row of the last statement) or `\aset
/// [prefix]` (every row of every statement, the last value kept).
#[derive(Debug, Clone, PartialEq)]
pub struct Store {
    pub all: bool,
    pub prefix: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Script {
    pub name: String,
    /// (line number, command)
    pub commands: Vec<(usize, Command)>,
}

impl Script {
    /// Splits a script as pgbench does: a meta-command is a line starting
    /// with `\` (continued by a trailing `\`); an SQL command runs to a
    /// `;` outside quotes (`'...'`, `E'...'` with backslash escapes,
    /// `"..."`, `$tag$...$tag$`), comments and parentheses, so several
    /// may share a line and a DO body keeps its semicolons; `\;` joins
    /// statements into one compound command.
    pub fn parse(name: &str, text: &str) -> Result<Script, ScriptError> {
        let err = |line, message: String| ScriptError {
            script: name.into(),
            line,
            message,
            text: None,
            column: None,
            hint: None,
        };
        let meta_err = |line, text: &str, e: MetaError| ScriptError {
            script: name.into(),
            line,
            message: e.message,
            text: Some(text.to_string()),
            column: e.column,
            hint: e.hint,
        };
        let mut commands = Vec::new();
        let mut lx = Lexer {
            b: text.as_bytes(),
            i: 0,
            line: 1,
        };
        loop {
            lx.skip_space_and_comments();
            if lx.i >= lx.b.len() {
                break;
            }
            let line = lx.line;
            if lx.b[lx.i] == b'\\' && lx.b.get(lx.i + 1) != Some(&b';') {
                let meta = lx.meta_line();
                let meta = meta.trim();
                commands.push((line, parse_meta(meta).map_err(|e| meta_err(line, meta, e))?));
                continue;
            }
            let (sql, compound, trailing_meta) = lx.sql().map_err(|m| err(line, m))?;
            let mut store = None;
            let mut next_meta = None;
            if let Some(meta) = trailing_meta {
                let mut words = meta.trim().trim_start_matches('\\').split_whitespace();
                let cmd = words.next().unwrap_or("").to_ascii_lowercase();
                let args: Vec<&str> = words.collect();
                if cmd == "gset" || cmd == "aset" {
                    if args.len() > 1 {
                        return Err(err(
                            line,
                            format!("too many arguments in command \"{cmd}\""),
                        ));
                    }
                    store = Some(Store {
                        all: cmd == "aset",
                        prefix: args.first().unwrap_or(&"").to_string(),
                    });
                } else {
                    next_meta = Some(meta);
                }
            }
            if !sql.trim().is_empty() || store.is_some() {
                let mut c = parse_sql(&sql, compound).map_err(|m| err(line, m))?;
                if let Command::Sql { store: s, .. } = &mut c {
                    *s = store;
                }
                commands.push((line, c));
            }
            if let Some(meta) = next_meta {
                let meta = meta.trim();
                commands.push((line, parse_meta(meta).map_err(|e| meta_err(line, meta, e))?));
            }
        }
        if commands.is_empty() {
            return Err(err(1, "empty command list for script".into()));
        }
        link_conditionals(&mut commands).map_err(|(line, m)| err(line, m))?;
        Ok(Script {
            name: name.into(),
            commands,
        })
    }

    /// Where execution goes after arriving in sequence at command `pc`, a
    /// conditional: into a true `\if`'s branch or on to the chain's next
    /// part; past the `\endif` at the end of a taken branch.
    pub fn branch(&self, pc: usize, env: &mut Env<'_>) -> Result<usize, String> {
        match &self.commands[pc].1 {
            Command::If { cond, next } => {
                if eval(cond, env)?.truth() {
                    Ok(pc + 1)
                } else {
                    self.enter(*next, env)
                }
            }
            Command::Elif { end, .. } | Command::Else { end } => Ok(end + 1),
            _ => Ok(pc + 1),
        }
    }

    /// Enters the chain's part at `at` after a false condition, walking
    /// on past each false `\elif` (a loop: a chain may be as long as the
    /// script, and recursion per `\elif` once overflowed the stack).
    fn enter(&self, mut at: usize, env: &mut Env<'_>) -> Result<usize, String> {
        while let Command::Elif { cond, next, .. } = &self.commands[at].1 {
            if eval(cond, env)?.truth() {
                break;
            }
            at = *next;
        }
        Ok(at + 1)
    }
}

/// Links each `\if` chain's parts, refusing what pgbench refuses.
fn link_conditionals(commands: &mut [(usize, Command)]) -> Result<(), (usize, String)> {
    // Open chains: their parts' indexes, and whether \else was seen.
    let mut open: Vec<(Vec<usize>, bool)> = Vec::new();
    for i in 0..commands.len() {
        let line = commands[i].0;
        match commands[i].1 {
            Command::If { .. } => open.push((vec![i], false)),
            Command::Elif { .. } | Command::Else { .. } => {
                let word = if matches!(commands[i].1, Command::Else { .. }) {
                    "\\else"
                } else {
                    "\\elif"
                };
                let Some((parts, seen_else)) = open.last_mut() else {
                    return Err((line, format!("{word} without matching \\if")));
                };
                if *seen_else {
                    return Err((line, format!("{word} after \\else")));
                }
                *seen_else = word == "\\else";
                parts.push(i);
            }
            Command::Endif => {
                let Some((mut parts, _)) = open.pop() else {
                    return Err((line, "\\endif without matching \\if".into()));
                };
                parts.push(i);
                for w in parts.windows(2) {
                    let (at, next) = (w[0], w[1]);
                    match &mut commands[at].1 {
                        Command::If { next: n, .. } => *n = next,
                        Command::Elif { next: n, end, .. } => {
                            *n = next;
                            *end = i;
                        }
                        Command::Else { end } => *end = i,
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    if let Some((parts, _)) = open.first() {
        return Err((
            commands[parts[0]].0,
            "\\if without matching \\endif at the end of the script".into(),
        ));
    }
    Ok(())
}

/// The script's text and where the lexer is (byte offset, line).
struct Lexer<'a> {
    b: &'a [u8],
    i: usize,
    line: usize,
}

impl Lexer<'_> {
    fn bump(&mut self) -> u8 {
        let c = self.b[self.i];
        if c == b'\n' {
            self.line += 1;
        }
        self.i += 1;
        c
    }

    fn at(&self, s: &[u8]) -> bool {
        self.b[self.i..].starts_with(s)
    }

    fn skip_space_and_comments(&mut self) {
        while self.i < self.b.len() {
            if self.b[self.i].is_ascii_whitespace() {
                self.bump();
            } else if self.at(b"--") {
                while self.i < self.b.len() && self.b[self.i] != b'\n' {
                    self.bump();
                }
            } else if self.at(b"/*") {
                self.block_comment();
            } else {
                break;
            }
        }
    }

    fn block_comment(&mut self) {
        let mut depth = 0;
        while self.i < self.b.len() {
            if self.at(b"/*") {
                depth += 1;
                self.bump();
                self.bump();
            } else if self.at(b"*/") {
                depth -= 1;
                self.bump();
                self.bump();
                if depth == 0 {
                    return;
                }
            } else {
                self.bump();
            }
        }
    }

    /// A meta-command's line, joined with the next while it ends with `\`.
    fn meta_line(&mut self) -> String {
        let mut out = String::new();
        loop {
            let start = self.i;
            while self.i < self.b.len() && self.b[self.i] != b'\n' {
                self.i += 1;
            }
            let mut piece = String::from_utf8_lossy(&self.b[start..self.i]).into_owned();
            if piece.ends_with('\r') {
                piece.pop();
            }
            let continued = piece.ends_with('\\');
            if continued {
                piece.pop();
            }
            out.push_str(&piece);
            if self.i < self.b.len() {
                self.bump();
            }
            if !continued || self.i >= self.b.len() {
                return out;
            }
            out.push(' ');
        }
    }

    /// One SQL command: its text (without the final `;`), whether `\;`
    /// joined statements, and the meta-command line (`\gset`) that ended it.
    fn sql(&mut self) -> Result<(String, bool, Option<String>), String> {
        let mut out: Vec<u8> = Vec::new();
        let mut depth = 0i32;
        let mut compound = false;
        let text = |out: &[u8]| String::from_utf8_lossy(out).into_owned();
        while self.i < self.b.len() {
            let c = self.b[self.i];
            match c {
                b';' if depth <= 0 => {
                    self.bump();
                    return Ok((text(&out), compound, None));
                }
                b'\\' if self.b.get(self.i + 1) == Some(&b';') => {
                    self.bump();
                    self.bump();
                    out.push(b';');
                    compound = true;
                }
                b'\\' if depth <= 0 => {
                    // A meta-command ends the SQL (\gset, \aset).
                    let meta = self.meta_line();
                    return Ok((text(&out), compound, Some(meta)));
                }
                b'(' | b'[' => {
                    depth += 1;
                    out.push(self.bump());
                }
                b')' | b']' => {
                    depth -= 1;
                    out.push(self.bump());
                }
                b'-' if self.at(b"--") => {
                    while self.i < self.b.len() && self.b[self.i] != b'\n' {
                        self.bump();
                    }
                }
                b'/' if self.at(b"/*") => {
                    let start = self.i;
                    self.block_comment();
                    out.extend_from_slice(&self.b[start..self.i]);
                }
                b'\'' => {
                    // E'...': backslash escapes (E not ending a longer word).
                    let n = out.len();
                    let escapes = n >= 1
                        && (out[n - 1] == b'E' || out[n - 1] == b'e')
                        && !(n >= 2 && (out[n - 2].is_ascii_alphanumeric() || out[n - 2] == b'_'));
                    self.quoted(&mut out, b'\'', escapes)?;
                }
                b'"' => self.quoted(&mut out, b'"', false)?,
                b'$' => match self.dollar_tag() {
                    Some(tag) => {
                        let start = self.i;
                        let line = self.line;
                        for _ in 0..tag.len() {
                            self.bump();
                        }
                        loop {
                            if self.i >= self.b.len() {
                                return Err(format!(
                                    "unterminated dollar-quoted string {tag} from line {line}"
                                ));
                            }
                            if self.at(tag.as_bytes()) {
                                for _ in 0..tag.len() {
                                    self.bump();
                                }
                                break;
                            }
                            self.bump();
                        }
                        out.extend_from_slice(&self.b[start..self.i]);
                    }
                    None => out.push(self.bump()),
                },
                _ => out.push(self.bump()),
            }
        }
        Ok((text(&out), compound, None))
    }

    /// A quoted string or identifier, copied; `''` (or `""`) inside.
    fn quoted(&mut self, out: &mut Vec<u8>, q: u8, escapes: bool) -> Result<(), String> {
        let line = self.line;
        out.push(self.bump());
        while self.i < self.b.len() {
            let c = self.bump();
            out.push(c);
            if escapes && c == b'\\' && self.i < self.b.len() {
                out.push(self.bump());
            } else if c == q {
                if self.b.get(self.i) == Some(&q) {
                    out.push(self.bump());
                } else {
                    return Ok(());
                }
            }
        }
        Err(format!(
            "unterminated quoted {} from line {line}",
            if q == b'"' { "identifier" } else { "string" }
        ))
    }

    /// `$tag$` at the cursor (not a `$1` parameter).
    fn dollar_tag(&self) -> Option<String> {
        let rest = &self.b[self.i + 1..];
        let n = rest
            .iter()
            .take_while(|c| c.is_ascii_alphanumeric() || **c == b'_' || **c >= 0x80)
            .count();
        if rest.first().is_some_and(u8::is_ascii_digit) || rest.get(n) != Some(&b'$') {
            return None;
        }
        Some(String::from_utf8_lossy(&self.b[self.i..self.i + n + 2]).into_owned())
    }
}

/// Each `:name` in `sql` as pgbench's `parseVariable` finds them: the
/// colon's offset and the name's end. A name starts with a letter, `_` or
/// a non-ASCII byte (so `::type` and `[1:2]` are not variables).
fn variables(sql: &str) -> impl Iterator<Item = (usize, usize)> + '_ {
    let b = sql.as_bytes();
    let name_byte = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c >= 0x80;
    let mut i = 0;
    std::iter::from_fn(move || {
        while i < b.len() {
            if b[i] != b':' {
                i += 1;
                continue;
            }
            let start = i + 1;
            if !b
                .get(start)
                .is_some_and(|c| name_byte(*c) && !c.is_ascii_digit())
            {
                while i < b.len() && b[i] == b':' {
                    i += 1;
                }
                continue;
            }
            let mut j = start;
            while j < b.len() && name_byte(b[j]) {
                j += 1;
            }
            let at = i;
            i = j;
            return Some((at, j));
        }
        None
    })
}

/// pgbench's `parseQuery`: every `:name` becomes `$n` for the extended
/// protocol — inside quotes too, as pgbench's prepared mode does. A
/// compound command keeps `:name` for simple-protocol substitution.
fn parse_sql(sql: &str, compound: bool) -> Result<Command, String> {
    let sql = sql.trim();
    let mut out = String::with_capacity(sql.len());
    let mut params: Vec<String> = Vec::new();
    let mut last = 0;
    // pgbench gives each occurrence its own parameter; pgfleet sends a
    // variable once, but keeps pgbench's limit on occurrences.
    let mut occurrences = 0;
    for (at, end) in variables(sql) {
        occurrences += 1;
        let name = &sql[at + 1..end];
        let n = match params.iter().position(|p| p == name) {
            Some(n) => n + 1,
            None => {
                params.push(name.to_string());
                params.len()
            }
        };
        if !compound {
            out.push_str(&sql[last..at]);
            out.push_str(&format!("${n}"));
            last = end;
        }
    }
    out.push_str(&sql[last..]);
    if occurrences > MAX_SQL_ARGS {
        return Err(format!(
            "statement has too many arguments (maximum is {MAX_SQL_ARGS})"
        ));
    }
    Ok(Command::Sql {
        sql: out,
        params,
        compound,
        store: None,
    })
}

/// pgbench's simple-protocol substitution: each `:name` whose variable is
/// defined becomes the variable's text (unquoted); others stay as they are.
pub fn substitute(sql: &str, vars: &Vars) -> String {
    let mut out = String::with_capacity(sql.len() + 16);
    let mut last = 0;
    for (at, end) in variables(sql) {
        if let Some(v) = vars.get(&sql[at + 1..end]) {
            out.push_str(&sql[last..at]);
            out.push_str(&v.to_string());
            last = end;
        }
    }
    out.push_str(&sql[last..]);
    out
}

/// Whether `text` might run a command on the host (`\shell`,
/// `\setshell`) under **any** parser that will read it: pgfleet's, or the
/// real pgbench's, which both take a meta-command after SQL or a comment on
/// the same line, any letter case, and backslash-newline continuations.
/// A superset by construction: every whitespace character is removed and
/// the ASCII-lowercased rest is searched for either name anywhere, so a
/// false positive is possible (`SELECT '\shell'`), a miss is not. Scenario
/// text that reaches a script (its `defines` too) is judged with this.
pub fn may_run_shell(text: &str) -> bool {
    // A backslash-newline continues a line for pgbench's lexer: joined
    // first, so `\she\` + newline + `ll` is read as pgbench would.
    let joined = text.replace("\\\r\n", "").replace("\\\n", "");
    let squeezed: String = joined
        .chars()
        .filter(|c| !c.is_whitespace() && *c != '\0')
        .map(|c| c.to_ascii_lowercase())
        .collect();
    squeezed.contains("\\shell") || squeezed.contains("\\setshell")
}

/// pgbench's limit on a statement's variables (MAX_ARGS - 1).
pub const MAX_SQL_ARGS: usize = 255;

fn parse_meta(line: &str) -> Result<Command, MetaError> {
    // Past the backslash (a trailing meta-command's text may not start with
    // one, or be empty: slicing at byte 1 once panicked on it).
    let body = line.strip_prefix('\\').unwrap_or(line);
    let mut parts = body.splitn(2, char::is_whitespace);
    let cmd = parts.next().unwrap_or("").to_ascii_lowercase();
    let rest = parts.next().unwrap_or("").trim();
    // Where `text`, a slice of `line`, starts in it (for carets).
    // (Saturating: an absent part is a literal "" from elsewhere.)
    let offset = |text: &str| {
        (text.as_ptr() as usize)
            .saturating_sub(line.as_ptr() as usize)
            .min(line.len())
    };
    match cmd.as_str() {
        "set" => {
            let mut p = rest.splitn(2, char::is_whitespace);
            let var = p.next().unwrap_or("");
            if var.is_empty() {
                return Err("missing argument in command \"set\"".into());
            }
            let expr_text = p.next().unwrap_or("").trim();
            if expr_text.is_empty() {
                return Err(MetaError {
                    message: "syntax error in command \"set\"".into(),
                    column: Some(line.len()),
                    hint: Some(format!("an expression is expected after {var}")),
                });
            }
            let expr = parse_expr(expr_text)
                .map_err(|e| MetaError::expr(e, "set", offset(expr_text)))?;
            // pgbench refuses a bad name only when the command runs.
            if !is_var_name(var) {
                return Ok(Command::Fail(format!("invalid variable name: \"{var}\"")));
            }
            Ok(Command::Set {
                var: var.into(),
                expr,
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
                    return Err(format!("invalid sleep time, must be an integer: \"{a}\"").into());
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
                    return Err(MetaError {
                        message: format!(
                            "unrecognized time unit, must be us, ms or s ({u}) in command \"sleep\""
                        ),
                        column: args.get(1).map(|a| offset(a)),
                        hint: None,
                    });
                }
            };
            Ok(Command::Sleep { amount, unit_us })
        }
        "if" | "elif" => {
            if rest.is_empty() {
                return Err(MetaError {
                    message: format!("syntax error in command \"{cmd}\""),
                    column: Some(line.len()),
                    hint: Some("a condition is expected".into()),
                });
            }
            let cond = parse_expr(rest).map_err(|e| MetaError::expr(e, &cmd, offset(rest)))?;
            Ok(if cmd == "if" {
                Command::If { cond, next: 0 }
            } else {
                Command::Elif {
                    cond,
                    next: 0,
                    end: 0,
                }
            })
        }
        "else" | "endif" => {
            if !rest.is_empty() {
                return Err(format!("unexpected argument in command \"{cmd}\"").into());
            }
            Ok(if cmd == "else" {
                Command::Else { end: 0 }
            } else {
                Command::Endif
            })
        }
        "gset" | "aset" => Err(format!("\\{cmd} must follow an SQL command").into()),
        "shell" | "setshell" => {
            let mut words: Vec<String> = rest.split_whitespace().map(String::from).collect();
            let var = if cmd == "setshell" {
                if words.len() < 2 {
                    return Err("missing argument in command \"setshell\"".into());
                }
                let v = words.remove(0);
                if !is_var_name(&v) {
                    return Ok(Command::Fail(format!("invalid variable name: \"{v}\"")));
                }
                Some(v)
            } else {
                if words.is_empty() {
                    return Err("missing command in command \"shell\"".into());
                }
                None
            };
            if words.len() > MAX_SQL_ARGS {
                return Err(format!("too many arguments in command \"{cmd}\"").into());
            }
            Ok(Command::Shell { var, args: words })
        }
        "startpipeline" | "syncpipeline" | "endpipeline" => {
            if !rest.is_empty() {
                return Err(format!("unexpected argument in command \"{cmd}\"").into());
            }
            Ok(Command::Pipeline(match cmd.as_str() {
                "startpipeline" => PipelineOp::Start,
                "syncpipeline" => PipelineOp::Sync,
                _ => PipelineOp::End,
            }))
        }
        other => Err(MetaError {
            message: format!("invalid command in command \"{other}\""),
            column: None,
            hint: Some(
                "pgbench's meta-commands are \\set, \\sleep, \\if, \\elif, \\else, \\endif, \\gset, \\aset, \\shell, \\setshell, \\startpipeline, \\syncpipeline and \\endpipeline".into(),
            ),
        }),
    }
}

fn is_var_name(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {

    /// Every placement the break-in probe used, and variants: the check is
    /// a superset of both parsers (a miss would run a command as root).
    #[test]
    fn a_shell_anywhere_in_the_text_is_found() {
        for t in [
            "\\shell id",
            "SELECT 1; \\shell id > /tmp/x",
            "SELECT 1; -- note \\shell id",
            "/* c */ \\shell id",
            "\\SHELL id",
            "\\SetShell x id",
            "  \t\\shell\tid",
            "\\she\\\nll id",
            "\\set\\\r\nshell x id",
            "\\ shell id",
            "SELECT '\\shell';",
        ] {
            assert!(may_run_shell(t), "{t:?}");
        }
        for t in [
            "SELECT 1;",
            "\\set aid random(1, 10)\nSELECT :aid;",
            "\\sleep 1 ms",
            "\\setrandom x 1 2",
        ] {
            assert!(!may_run_shell(t), "{t:?}");
        }
    }
    use super::*;

    fn ev(s: &str) -> Result<Value, String> {
        let vars: Vars = [
            ("scale".to_string(), Value::Int(10).into()),
            ("x".to_string(), Value::Double(1.5).into()),
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

    /// Hostile depths are refused with a located error, on a thread with
    /// a tokio worker's stack (2 MiB), in this unoptimized build: no
    /// overflow, no abort.
    #[test]
    fn deep_expressions_and_long_chains_are_refused_not_overflowed() {
        let run = || {
            let parens = format!("{}1{}", "(".repeat(3000), ")".repeat(3000));
            let chain = vec!["1"; 50_000].join(" + ");
            let unary = format!("{}1", "- ".repeat(5000));
            let calls = format!("{}1{}", "abs(".repeat(2000), ")".repeat(2000));
            let nots = format!("{}true", "not ".repeat(5000));
            for text in [&parens, &chain, &unary, &calls, &nots] {
                let e = parse_expr(text).unwrap_err();
                assert_eq!(e.message, "expression is too deeply nested", "{e}");
                assert!(e.hint.as_deref().unwrap().contains("at most 100"), "{e}");
            }
            // At the bound it parses and evaluates.
            let ok = format!("{}1{}", "(".repeat(90), ")".repeat(90));
            assert_eq!(ev(&ok).unwrap(), Value::Int(1));
            let ok = vec!["1"; MAX_EXPR_DEPTH].join(" + ");
            assert_eq!(ev(&ok).unwrap(), Value::Int(MAX_EXPR_DEPTH as i64));
            // Through a script: located at its line.
            let script = format!("\\set x {chain}\nSELECT 1;\n");
            let e = Script::parse("deep", &script).unwrap_err();
            assert_eq!(e.line, 1);
            assert!(e.message.contains("too deeply nested"), "{e}");
        };
        std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(run)
            .unwrap()
            .join()
            .unwrap();
    }

    /// Meta-command text that is empty or starts with a multi-byte
    /// character is refused, never sliced mid-character (the scenario
    /// fuzz test found the panic).
    #[test]
    fn odd_meta_command_text_is_refused_not_panicked_on() {
        for line in ["", "é", "\\", "\\é", "\\if", "\\elif", "\\set x", "\\sleep"] {
            assert!(parse_meta(line).is_err(), "{line:?}");
        }
    }

    /// 30,000 `\elif`s walk without recursion.
    #[test]
    fn a_long_elif_chain_runs_in_a_loop() {
        let mut text = String::from("\\if false\nSELECT 0;\n");
        for i in 1..30_000 {
            text.push_str(&format!("\\elif :scale = {}\nSELECT {i};\n", i + 1_000_000));
        }
        text.push_str("\\else\nSELECT 42;\n\\endif\n");
        let run = move || {
            let script = Script::parse("elifs", &text).unwrap();
            let vars: Vars = [("scale".to_string(), Value::Int(10).into())]
                .into_iter()
                .collect();
            let mut rng = rng::Rng::seeded(7);
            let mut env = Env {
                vars: &vars,
                rng: &mut rng,
                debug: None,
            };
            let pc = script.branch(0, &mut env).unwrap();
            let last = script.commands.len() - 2;
            assert_eq!(pc, last, "the \\else branch's SELECT 42");
        };
        std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn(run)
            .unwrap()
            .join()
            .unwrap();
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
                .contains("unexpected function name (rnd)")
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
                params: vec!["delta".into(), "aid".into()],
                compound: false,
                store: None,
            }
        );
        // pgbench replaces a variable inside quotes too (its prepared mode).
        assert_eq!(
            s.commands[4].1,
            Command::Sql {
                sql: "SELECT '$1', x::int, $2 FROM t".into(),
                params: vec!["notavar".into(), "aid".into()],
                compound: false,
                store: None,
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

    fn sql_of(script: &str) -> Vec<(usize, String)> {
        Script::parse("s", script)
            .unwrap_or_else(|e| panic!("{script:?}: {e}"))
            .commands
            .into_iter()
            .filter_map(|(line, c)| match c {
                Command::Sql { sql, .. } => Some((line, sql)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn sql_splits_where_pgbench_splits() {
        // Two statements on one line are two commands.
        assert_eq!(
            sql_of("SELECT 1; SELECT 2;\nSELECT 3;"),
            [
                (1, "SELECT 1".into()),
                (1, "SELECT 2".into()),
                (2, "SELECT 3".into())
            ]
        );
        // A DO body keeps its semicolons; so do E'' strings, quoted
        // identifiers, nested comments and parentheses.
        let body = "DO $$\nBEGIN\n  PERFORM 1;\n  RAISE NOTICE 'x;';\nEND\n$$";
        assert_eq!(
            sql_of(&format!("{body};\nSELECT 1;")),
            [(1, body.into()), (7, "SELECT 1".into())]
        );
        let tagged = "DO $f$ BEGIN PERFORM $$;$$; END $f$";
        assert_eq!(sql_of(&format!("{tagged};")), [(1, tagged.into())]);
        assert_eq!(
            sql_of("SELECT E'it\\'s;', 'a''b;', \"c;d\" FROM t /* x; /* y; */ z; */;"),
            [(
                1,
                "SELECT E'it\\'s;', 'a''b;', \"c;d\" FROM t /* x; /* y; */ z; */".into()
            )]
        );
        assert_eq!(
            sql_of("SELECT (SELECT 1; ) ;"),
            [(1, "SELECT (SELECT 1; )".into())],
            "no end inside parentheses"
        );
        // Array slices are not variables; casts are not either.
        let s = Script::parse("s", "SELECT (ARRAY[1,2,3])[1:2], x::int[], :v;").unwrap();
        assert_eq!(
            s.commands[0].1,
            Command::Sql {
                sql: "SELECT (ARRAY[1,2,3])[1:2], x::int[], $1".into(),
                params: vec!["v".into()],
                compound: false,
                store: None,
            }
        );
        // `\;` joins statements into one compound command.
        let s = Script::parse("s", "SELECT :a \\; SELECT 2;\n").unwrap();
        assert_eq!(
            s.commands[0].1,
            Command::Sql {
                sql: "SELECT :a ; SELECT 2".into(),
                params: vec!["a".into()],
                compound: true,
                store: None,
            }
        );
        // `--` comments go, a trailing command without `;` counts.
        assert_eq!(
            sql_of("-- lead\nSELECT 1 -- trailing; not an end\n, 2"),
            [(2, "SELECT 1 \n, 2".into())]
        );
        // Meta-commands continue on the next line after a trailing `\`.
        let s = Script::parse("s", "\\set x 1 +\\\n  2\nSELECT :x;").unwrap();
        assert_eq!(s.commands.len(), 2);
        let e = Script::parse("s", "SELECT 'open;\n").unwrap_err();
        assert!(e.message.contains("unterminated quoted string"), "{e}");
        let s = Script::parse("s", "SELECT 1 AS a \\gset p_\nSELECT 2 \\aset\n").unwrap();
        assert!(
            matches!(&s.commands[0].1, Command::Sql { store: Some(Store { all: false, prefix }), .. } if prefix == "p_")
        );
        assert!(matches!(
            &s.commands[1].1,
            Command::Sql {
                store: Some(Store { all: true, .. }),
                ..
            }
        ));
        for (bad, want) in [
            ("\\gset\n", "gset must follow an SQL command"),
            (
                "SELECT 1 AS i \\gset\n\\gset\n",
                "gset must follow an SQL command",
            ),
            ("SELECT 1 \\gset a b\n", "too many arguments"),
            ("\\shell\n", "missing command"),
            ("\\setshell x\n", "missing argument"),
            ("\\startpipeline now\n", "unexpected argument"),
        ] {
            let e = Script::parse("s", bad).unwrap_err();
            assert!(e.message.contains(want), "{bad:?}: {e}");
        }
        // pgbench's limit counts occurrences, not distinct variables.
        let many: Vec<String> = (0..255).map(|_| ":i".to_string()).collect();
        assert!(Script::parse("s", &format!("SELECT least({});", many.join(", "))).is_ok());
        let distinct: Vec<String> = (0..256).map(|k| format!(":v{k}")).collect();
        let e = Script::parse("s", &format!("SELECT least({});", distinct.join(", "))).unwrap_err();
        assert!(
            e.message.contains("too many arguments (maximum is 255)"),
            "{e}"
        );
    }

    #[test]
    fn compound_commands_substitute_text_as_pgbench_s_simple_mode() {
        let vars: Vars = [
            ("a".to_string(), Value::Int(5).into()),
            ("d".to_string(), Value::Double(0.1 + 0.2).into()),
            // Text is substituted as it came (pgbench's -D, \gset).
            ("t".to_string(), Var::Text("pgbench_accounts".into())),
            ("z".to_string(), Var::Text("1.50".into())),
        ]
        .into_iter()
        .collect();
        assert_eq!(
            substitute("SELECT :a, :d, :nope, x::int, :z FROM :t; SELECT 2", &vars),
            "SELECT 5, 0.3, :nope, x::int, 1.50 FROM pgbench_accounts; SELECT 2"
        );
    }

    #[test]
    fn script_errors_name_script_and_line() {
        let e = Script::parse("mine", "SELECT 1;\n\\set x rnd(1, 2)\n").unwrap_err();
        assert_eq!((e.script.as_str(), e.line), ("mine", 2));
        assert!(
            e.to_string().starts_with(
                "mine:2: unexpected function name (rnd) in command \"set\"\n\\set x rnd(1, 2)\n       ^ error found here"
            ),
            "{e}"
        );
        let e = Script::parse("mine", "\\nosuch ls\nSELECT 1;").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("mine:1: invalid command in command \"nosuch\"\n\\nosuch ls\n"),
            "{e}"
        );
        let e = Script::parse("mine", "-- nothing\n").unwrap_err();
        assert!(e.message.contains("empty command list"), "{e}");
        let e = Script::parse("mine", "SELECT 1;\n\\sleep 1 min\n").unwrap_err();
        assert_eq!(e.line, 2);
    }
}
