//! The HTTP API's bearer tokens (`serve --api-token-file`): one per line,
//! each at least 16 characters; a line `read-only TOKEN` gives a token that
//! may read (runs, events, reports, agents) but not submit or cancel.
//! Blank lines and `#` comments are skipped. The file is read again when it
//! changes, so a token is rotated by adding the new one, moving clients
//! over, then removing the old one, without restarting the server. A file
//! that becomes unreadable or holds no valid token keeps the last good set
//! (and says so in the log).

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use pgfleet_store::Error;
use pgfleet_store::Result;

/// What a token lets its holder do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Everything: submit, cancel, read.
    Full,
    /// GET only: runs, events, reports, agents, the OpenAPI document.
    ReadOnly,
}

#[derive(Debug)]
pub struct ApiTokens {
    path: PathBuf,
    state: Mutex<Read>,
}

impl ApiTokens {
    /// Reads the file; an error names it and says what to fix.
    pub fn load(path: &Path) -> Result<ApiTokens> {
        let (mtime, tokens) = read(path)?;
        Ok(ApiTokens {
            path: path.to_path_buf(),
            state: Mutex::new((mtime, tokens)),
        })
    }

    /// The access `given` grants, if any (each token compared in constant
    /// time); re-reads the file first when it has changed.
    pub fn check(&self, given: &str) -> Option<Access> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let mtime = std::fs::metadata(&self.path)
            .and_then(|m| m.modified())
            .ok();
        if mtime != st.0 {
            match read(&self.path) {
                Ok(fresh) => *st = fresh,
                Err(e) => {
                    tracing::warn!("keeping the API tokens read before: {e}");
                    st.0 = mtime;
                }
            }
        }
        let mut found = None;
        for (access, token) in &st.1 {
            // Every token is compared, so the time taken does not say which
            // one (or how much of one) matched.
            if crate::grpc::constant_time_eq(given.as_bytes(), token.as_bytes()) {
                found = Some(*access);
            }
        }
        found
    }
}

/// The file's modification time when read, and its tokens.
type Read = (Option<SystemTime>, Vec<(Access, String)>);

fn read(path: &Path) -> Result<Read> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        Error::Usage(format!(
            "reading the API token file {}: {e}",
            path.display()
        ))
    })?;
    let mtime = std::fs::metadata(path).and_then(|m| m.modified()).ok();
    let mut tokens = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (access, token) = match line.split_once(char::is_whitespace) {
            Some(("read-only", t)) => (Access::ReadOnly, t.trim()),
            Some((kind, _)) => {
                return Err(Error::Usage(format!(
                    "{}:{}: `{kind}` is not a token kind: write a token alone (full access) or `read-only TOKEN`",
                    path.display(),
                    n + 1
                )));
            }
            None => (Access::Full, line),
        };
        if token.len() < 16 {
            return Err(Error::Usage(format!(
                "{}:{}: the token is too short: use at least 16 characters (e.g. `openssl rand -hex 32`)",
                path.display(),
                n + 1
            )));
        }
        tokens.push((access, token.to_string()));
    }
    if tokens.is_empty() {
        return Err(Error::Usage(format!(
            "{} holds no token: write one per line (at least 16 characters), `read-only TOKEN` for read-only access",
            path.display()
        )));
    }
    Ok((mtime, tokens))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_read_rotated_and_kept_on_a_bad_edit() {
        let dir = std::env::temp_dir().join(format!("pgfleet-tokens-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("tokens");
        std::fs::write(
            &f,
            "# CI\n0123456789abcdef-full\nread-only 0123456789abcdef-read\n",
        )
        .unwrap();
        let t = ApiTokens::load(&f).unwrap();
        assert_eq!(t.check("0123456789abcdef-full"), Some(Access::Full));
        assert_eq!(t.check("0123456789abcdef-read"), Some(Access::ReadOnly));
        assert_eq!(t.check("0123456789abcdef"), None);
        assert_eq!(t.check(""), None);
        // Rotation: the new token works and the old one stops, no restart.
        // (mtime granularity: make the change visible.)
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&f, "fedcba9876543210-new\n").unwrap();
        let later = SystemTime::now() + std::time::Duration::from_secs(2);
        std::fs::File::options()
            .write(true)
            .open(&f)
            .unwrap()
            .set_modified(later)
            .unwrap();
        assert_eq!(t.check("fedcba9876543210-new"), Some(Access::Full));
        assert_eq!(t.check("0123456789abcdef-full"), None);
        // A bad edit keeps the last good set.
        std::fs::write(&f, "short\n").unwrap();
        std::fs::File::options()
            .write(true)
            .open(&f)
            .unwrap()
            .set_modified(later + std::time::Duration::from_secs(2))
            .unwrap();
        assert_eq!(t.check("fedcba9876543210-new"), Some(Access::Full));
        let e = ApiTokens::load(&f).unwrap_err().to_string();
        assert!(e.contains(":1:") && e.contains("too short"), "{e}");
        std::fs::write(&f, "admin 0123456789abcdef\n").unwrap();
        let e = ApiTokens::load(&f).unwrap_err().to_string();
        assert!(e.contains("not a token kind"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
