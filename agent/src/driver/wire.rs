//! The driver's own PostgreSQL connection: the small part of the wire
//! protocol a pgbench client needs, with nothing between the client loop and
//! the socket.
//!
//! pgbench `-M prepared` sends, per SQL command, Bind + Execute + Sync with
//! text parameters and waits for ReadyForQuery (libpq's
//! `PQsendQueryPrepared`). This module does the same: the client task owns
//! its socket and two reused buffers, encodes a statement into one write
//! and parses the replies in place, so a statement costs no allocation, no
//! channel and no task hop (tokio-postgres' client/connection split costs
//! ~30 % more client CPU per transaction; see BENCHMARKS.md).
//!
//! Supported: TCP or Unix-socket hosts; trust, cleartext, MD5 and
//! SCRAM-SHA-256 authentication (no TLS: the driver talks to the cluster it
//! provisioned on loopback); named statements prepared once per connection;
//! simple queries for transaction control after errors.

use std::fmt::Write as _;
use std::io;

use bytes::BytesMut;
use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256};
use postgres_protocol::message::frontend;
use postgres_protocol::{IsNull, authentication};
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio_postgres::config::Host;

use super::script::Var;

/// An error from the server (SQLSTATE and message) or from the connection.
#[derive(Debug)]
pub enum WireError {
    Db {
        code: String,
        message: String,
    },
    /// The connection is unusable (I/O error, protocol violation).
    Closed(String),
}

impl WireError {
    pub fn code(&self) -> Option<&str> {
        match self {
            WireError::Db { code, .. } => Some(code),
            WireError::Closed(_) => None,
        }
    }
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WireError::Db { code, message } => write!(f, "{message} ({code})"),
            WireError::Closed(m) => write!(f, "connection lost: {m}"),
        }
    }
}

impl From<io::Error> for WireError {
    fn from(e: io::Error) -> Self {
        WireError::Closed(e.to_string())
    }
}

enum Stream {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

/// Transaction status from the last ReadyForQuery: idle, in a transaction
/// block, or in a failed one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxStatus {
    Idle,
    InTransaction,
    Failed,
}

pub struct Conn {
    stream: Stream,
    out: BytesMut,
    /// Received bytes; `buf[pos..len]` is not consumed yet.
    buf: Vec<u8>,
    pos: usize,
    len: usize,
    status: TxStatus,
}

/// One backend message: its type byte and body (`buf[start..end]`).
#[derive(Clone, Copy)]
struct Msg {
    tag: u8,
    start: usize,
    end: usize,
}

impl Conn {
    /// Connects and authenticates with the host, port, user, password and
    /// database of `cfg` (the first host that accepts a connection).
    pub async fn connect(cfg: &tokio_postgres::Config) -> Result<Conn, WireError> {
        let ports = cfg.get_ports();
        let mut last = WireError::Closed("no host in the connection settings".into());
        for (i, host) in cfg.get_hosts().iter().enumerate() {
            let port = ports
                .get(i)
                .or_else(|| ports.first())
                .copied()
                .unwrap_or(5432);
            let stream = match host {
                Host::Tcp(h) => tokio::net::TcpStream::connect((h.as_str(), port))
                    .await
                    .and_then(|s| s.set_nodelay(true).map(|()| Stream::Tcp(s))),
                Host::Unix(dir) => {
                    tokio::net::UnixStream::connect(dir.join(format!(".s.PGSQL.{port}")))
                        .await
                        .map(Stream::Unix)
                }
            };
            match stream {
                Ok(s) => return Conn::startup(s, cfg).await,
                Err(e) => last = WireError::Closed(format!("connecting to {host:?}:{port}: {e}")),
            }
        }
        Err(last)
    }

    async fn startup(stream: Stream, cfg: &tokio_postgres::Config) -> Result<Conn, WireError> {
        let mut c = Conn {
            stream,
            out: BytesMut::with_capacity(4096),
            buf: vec![0; 16 * 1024],
            pos: 0,
            len: 0,
            status: TxStatus::Idle,
        };
        let user = cfg.get_user().unwrap_or("postgres");
        let mut params = vec![("user", user), ("client_encoding", "UTF8")];
        if let Some(db) = cfg.get_dbname() {
            params.push(("database", db));
        }
        params.push((
            "application_name",
            cfg.get_application_name().unwrap_or("pgfleet-driver"),
        ));
        // The session's startup options (the superuser's pinned search
        // path, `cluster::SUPERUSER_OPTIONS`), as libpq sends them.
        if let Some(o) = cfg.get_options() {
            params.push(("options", o));
        }
        frontend::startup_message(params, &mut c.out)?;
        c.flush().await?;
        let password = cfg.get_password().unwrap_or_default();
        let mut scram: Option<ScramSha256> = None;
        loop {
            let m = c.next().await?;
            let body = &c.buf[m.start..m.end];
            match m.tag {
                b'R' => {
                    let kind = be_i32(body, 0)?;
                    match kind {
                        0 => {} // AuthenticationOk
                        3 => frontend::password_message(password, &mut c.out)?,
                        5 => {
                            let salt: [u8; 4] = body
                                .get(4..8)
                                .and_then(|s| s.try_into().ok())
                                .ok_or_else(|| protocol("short MD5 request"))?;
                            let hash = authentication::md5_hash(user.as_bytes(), password, salt);
                            frontend::password_message(hash.as_bytes(), &mut c.out)?;
                        }
                        10 => {
                            let offers_scram =
                                body[4..].split(|b| *b == 0).any(|m| m == b"SCRAM-SHA-256");
                            if !offers_scram {
                                return Err(protocol(
                                    "the server offers no SASL mechanism the driver supports (SCRAM-SHA-256)",
                                ));
                            }
                            let s = ScramSha256::new(password, ChannelBinding::unsupported());
                            frontend::sasl_initial_response(
                                "SCRAM-SHA-256",
                                s.message(),
                                &mut c.out,
                            )?;
                            scram = Some(s);
                        }
                        11 | 12 => {
                            let s = scram
                                .as_mut()
                                .ok_or_else(|| protocol("SASL message before SASL start"))?;
                            if kind == 11 {
                                s.update(&body[4..])?;
                                frontend::sasl_response(s.message(), &mut c.out)?;
                            } else {
                                s.finish(&body[4..])?;
                            }
                        }
                        k => {
                            return Err(protocol(&format!(
                                "authentication method {k} is not supported by the driver"
                            )));
                        }
                    }
                    if !c.out.is_empty() {
                        c.flush().await?;
                    }
                }
                b'E' => return Err(db_error(body)),
                b'Z' => {
                    c.status = tx_status(body)?;
                    return Ok(c);
                }
                // ParameterStatus, BackendKeyData, notices.
                _ => {}
            }
        }
    }

    pub fn status(&self) -> TxStatus {
        self.status
    }

    /// Prepares `sql` as statement `name` (parameter types inferred by the
    /// server, as pgbench's prepare does).
    pub async fn prepare(&mut self, name: &str, sql: &str) -> Result<(), WireError> {
        frontend::parse(name, sql, std::iter::empty(), &mut self.out)?;
        frontend::sync(&mut self.out);
        self.flush().await?;
        self.finish().await
    }

    /// Executes prepared statement `name` with `params` sent as text, and
    /// discards the rows (pgbench reads none either).
    pub async fn execute(&mut self, name: &str, params: &[Var]) -> Result<(), WireError> {
        self.bind_execute(name, params, false)?;
        self.flush().await?;
        self.finish().await
    }

    /// Executes prepared statement `name` and returns its rows as text
    /// (`\gset`, `\aset`).
    pub async fn execute_rows(
        &mut self,
        name: &str,
        params: &[Var],
    ) -> Result<Vec<ResultSet>, WireError> {
        self.bind_execute(name, params, true)?;
        self.flush().await?;
        self.finish_rows().await
    }

    /// Runs `sql` as a simple query and returns each statement's rows.
    pub async fn simple_rows(&mut self, sql: &str) -> Result<Vec<ResultSet>, WireError> {
        frontend::query(sql, &mut self.out)?;
        self.flush().await?;
        self.finish_rows().await
    }

    /// Reads replies up to ReadyForQuery, keeping each statement's rows.
    async fn finish_rows(&mut self) -> Result<Vec<ResultSet>, WireError> {
        let mut error = None;
        let mut sets = Vec::new();
        let mut current: Option<ResultSet> = None;
        loop {
            let m = self.next().await?;
            let body = &self.buf[m.start..m.end];
            match m.tag {
                b'Z' => {
                    self.status = tx_status(body)?;
                    return match error {
                        Some(e) => Err(e),
                        None => Ok(sets),
                    };
                }
                b'E' if error.is_none() => error = Some(db_error(body)),
                b'T' => current = Some(row_description(body)?),
                b'D' => {
                    let row = data_row(body)?;
                    if let Some(c) = current.as_mut() {
                        c.rows.push(row);
                    }
                }
                // CommandComplete, EmptyQueryResponse: one statement done.
                b'C' | b'I' => sets.push(current.take().unwrap_or_default()),
                _ => {}
            }
        }
    }

    fn bind_execute(
        &mut self,
        name: &str,
        params: &[Var],
        describe: bool,
    ) -> Result<(), WireError> {
        frontend::bind(
            "",
            name,
            std::iter::empty(),
            params,
            |v, out| {
                // As pgbench substitutes it: %.15g doubles, NULL as "NULL".
                write!(out, "{v}")
                    .map_err(|e| -> Box<dyn std::error::Error + Sync + Send> { Box::new(e) })?;
                Ok(IsNull::No)
            },
            std::iter::empty(),
            &mut self.out,
        )
        .map_err(|e| match e {
            frontend::BindError::Conversion(e) => protocol(&format!("encoding a parameter: {e}")),
            frontend::BindError::Serialization(e) => WireError::from(e),
        })?;
        if describe {
            frontend::describe(b'P', "", &mut self.out)?;
        }
        frontend::execute("", 0, &mut self.out)?;
        frontend::sync(&mut self.out);
        Ok(())
    }

    // ---- pipeline mode (pgbench's \startpipeline .. \endpipeline) ----
    // Statements are queued without a Sync; \syncpipeline adds one;
    // \endpipeline adds the last, sends everything and reads every reply.

    /// Queues a Parse of `sql` as statement `name`.
    pub fn queue_prepare(&mut self, name: &str, sql: &str) -> Result<(), WireError> {
        frontend::parse(name, sql, std::iter::empty(), &mut self.out)?;
        Ok(())
    }

    /// Queues an execution of statement `name`.
    pub fn queue_execute(&mut self, name: &str, params: &[Var]) -> Result<(), WireError> {
        self.bind_execute(name, params, false)?;
        // bind_execute ends with a Sync; a pipeline has none between its
        // statements: take it back off (its 5 bytes: 'S' and the length).
        let n = self.out.len();
        self.out.truncate(n - 5);
        Ok(())
    }

    /// A Sync point inside the pipeline; returns how many are now queued.
    pub fn queue_sync(&mut self) {
        frontend::sync(&mut self.out);
    }

    /// Sends the pipeline with a final Sync and reads the replies to its
    /// `syncs` + 1 Syncs; returns the first error.
    pub async fn end_pipeline(&mut self, syncs: usize) -> Result<(), WireError> {
        frontend::sync(&mut self.out);
        self.flush().await?;
        let mut first = None;
        for _ in 0..=syncs {
            if let Err(e) = self.finish().await {
                if matches!(e, WireError::Closed(_)) {
                    return Err(e);
                }
                first.get_or_insert(e);
            }
        }
        match first {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Runs `sql` as a simple query (e.g. `ROLLBACK`).
    pub async fn simple(&mut self, sql: &str) -> Result<(), WireError> {
        frontend::query(sql, &mut self.out)?;
        self.flush().await?;
        self.finish().await
    }

    /// Reads replies up to ReadyForQuery; returns the first error, if any.
    async fn finish(&mut self) -> Result<(), WireError> {
        let mut error = None;
        loop {
            let m = self.next().await?;
            match m.tag {
                b'Z' => {
                    self.status = tx_status(&self.buf[m.start..m.end])?;
                    return match error {
                        Some(e) => Err(e),
                        None => Ok(()),
                    };
                }
                b'E' if error.is_none() => error = Some(db_error(&self.buf[m.start..m.end])),
                // ParseComplete, BindComplete, DataRow, CommandComplete,
                // EmptyQuery, notices, parameter status, notifications.
                _ => {}
            }
        }
    }

    async fn flush(&mut self) -> Result<(), WireError> {
        if self.pos == self.len {
            // Everything received is consumed and the server answers only
            // after this request: forget the socket's stale readable state,
            // so the read after the write waits for the reply instead of
            // first failing with EAGAIN (one syscall less per statement).
            let would_block = || Err::<(), _>(io::ErrorKind::WouldBlock.into());
            let _ = match &self.stream {
                Stream::Tcp(s) => s.try_io(Interest::READABLE, would_block),
                Stream::Unix(s) => s.try_io(Interest::READABLE, would_block),
            };
        }
        match &mut self.stream {
            Stream::Tcp(s) => s.write_all(&self.out).await?,
            Stream::Unix(s) => s.write_all(&self.out).await?,
        }
        self.out.clear();
        Ok(())
    }

    /// The next complete backend message, reading from the socket as needed.
    async fn next(&mut self) -> Result<Msg, WireError> {
        loop {
            let avail = self.len - self.pos;
            if avail >= 5 {
                let p = self.pos;
                let body_len = be_i32(&self.buf, p + 1)? as usize;
                if body_len < 4 {
                    return Err(protocol("message length below 4"));
                }
                let total = 1 + body_len;
                if avail >= total {
                    self.pos += total;
                    return Ok(Msg {
                        tag: self.buf[p],
                        start: p + 5,
                        end: p + total,
                    });
                }
                if total > self.buf.len() {
                    // A message larger than the buffer (a big row): grow.
                    self.compact();
                    self.buf.resize(total.next_power_of_two(), 0);
                }
            }
            if self.pos == self.len {
                self.pos = 0;
                self.len = 0;
            } else if self.len == self.buf.len() {
                self.compact();
            }
            let dst = &mut self.buf[self.len..];
            let n = match &mut self.stream {
                Stream::Tcp(s) => s.read(dst).await?,
                Stream::Unix(s) => s.read(dst).await?,
            };
            if n == 0 {
                return Err(WireError::Closed("the server closed the connection".into()));
            }
            self.len += n;
        }
    }

    fn compact(&mut self) {
        self.buf.copy_within(self.pos..self.len, 0);
        self.len -= self.pos;
        self.pos = 0;
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        // Best effort Terminate, so the server logs no "unexpected EOF".
        let mut t = BytesMut::with_capacity(5);
        frontend::terminate(&mut t);
        match &self.stream {
            Stream::Tcp(s) => {
                let _ = s.try_write(&t);
            }
            Stream::Unix(s) => {
                let _ = s.try_write(&t);
            }
        }
    }
}

/// One statement's result: its columns and rows as text (None: NULL).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ResultSet {
    pub columns: Vec<String>,
    pub rows: Vec<Vec<Option<String>>>,
}

fn be_i16(b: &[u8], at: usize) -> Result<i16, WireError> {
    b.get(at..at + 2)
        .map(|x| i16::from_be_bytes([x[0], x[1]]))
        .ok_or_else(|| protocol("message shorter than its fields"))
}

fn row_description(body: &[u8]) -> Result<ResultSet, WireError> {
    let n = be_i16(body, 0)?.max(0) as usize;
    let mut at = 2;
    let mut columns = Vec::with_capacity(n);
    for _ in 0..n {
        let end = body[at..]
            .iter()
            .position(|b| *b == 0)
            .ok_or_else(|| protocol("unterminated column name"))?;
        columns.push(String::from_utf8_lossy(&body[at..at + end]).into_owned());
        // The name, its NUL, then table oid, attnum, type oid, size, modifier, format.
        at += end + 1 + 18;
    }
    Ok(ResultSet {
        columns,
        rows: Vec::new(),
    })
}

fn data_row(body: &[u8]) -> Result<Vec<Option<String>>, WireError> {
    let n = be_i16(body, 0)?.max(0) as usize;
    let mut at = 2;
    let mut row = Vec::with_capacity(n);
    for _ in 0..n {
        let len = be_i32(body, at)?;
        at += 4;
        if len < 0 {
            row.push(None);
        } else {
            let end = at + len as usize;
            let v = body
                .get(at..end)
                .ok_or_else(|| protocol("data row shorter than its values"))?;
            row.push(Some(String::from_utf8_lossy(v).into_owned()));
            at = end;
        }
    }
    Ok(row)
}

fn tx_status(body: &[u8]) -> Result<TxStatus, WireError> {
    match body.first() {
        Some(b'I') => Ok(TxStatus::Idle),
        Some(b'T') => Ok(TxStatus::InTransaction),
        Some(b'E') => Ok(TxStatus::Failed),
        _ => Err(protocol("bad ReadyForQuery")),
    }
}

fn protocol(m: &str) -> WireError {
    WireError::Closed(format!("protocol error: {m}"))
}

fn be_i32(b: &[u8], at: usize) -> Result<i32, WireError> {
    b.get(at..at + 4)
        .map(|s| i32::from_be_bytes([s[0], s[1], s[2], s[3]]))
        .ok_or_else(|| protocol("short message"))
}

/// SQLSTATE and message of an ErrorResponse body.
fn db_error(body: &[u8]) -> WireError {
    let (mut code, mut message) = (String::new(), String::new());
    let mut rest = body;
    while let Some((&kind, tail)) = rest.split_first() {
        if kind == 0 {
            break;
        }
        let end = tail.iter().position(|b| *b == 0).unwrap_or(tail.len());
        let value = String::from_utf8_lossy(&tail[..end]);
        match kind {
            b'C' => code = value.into_owned(),
            b'M' => message = value.into_owned(),
            _ => {}
        }
        rest = tail.get(end + 1..).unwrap_or_default();
    }
    WireError::Db { code, message }
}
