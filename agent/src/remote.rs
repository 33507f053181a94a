//! A remote dataset store: S3-compatible object storage, the way datasets
//! cross hosts (and the only way for an instance-store disk, which dies
//! with its instance). It sits behind the local store (`dataset.rs`): a
//! cell that would build a dataset first looks for it here and downloads
//! it into the local store, then restores it as any local dataset; a cell
//! that built and published one locally uploads it.
//!
//! Layout under `s3://BUCKET/PREFIX/<fingerprint>/`: `parts/<upload>/NNNNN.zst`,
//! PGDATA's files cut into parts of up to 64 MiB, each zstd-compressed,
//! then `manifest.json`, written last (a build killed half-way leaves no
//! manifest, so nothing uses it): the local store's manifest (every file's
//! SHA-256) and per part its compressed size, SHA-256 and the file ranges it
//! holds. Parts go up and come down four at a time; each downloaded part is
//! checked against its SHA-256 before a byte of it is written, and every
//! file again by the restore. A part that does not match is
//! `Error::DatasetCorrupt`: the cell discards the remote dataset and builds
//! it again. The manifest is not trusted either: paths must stay inside
//! PGDATA and ranges inside their files.
//!
//! Credentials, region and endpoint come from the environment, as AWS's
//! tools read them (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
//! `AWS_REGION`, `AWS_ENDPOINT_URL` for an S3-compatible server; on
//! Kubernetes from a Secret). The manifest holds the dataset's superuser
//! password, as the local one does: the bucket's access is its boundary.

use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::{Component, Path};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::ObjectStore;
use object_store::path::Path as Key;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use crate::{Error, Result};
use pgfleet_proto::dataset::{LocalStore, Manifest, hex};

/// Raw bytes per part (a part never holds more).
pub const PART_BYTES: u64 = 64 << 20;
/// Parts in flight at once, each way.
const PARALLEL: usize = 4;
const ZSTD_LEVEL: i32 = 3;
/// The remote layout's version: a manifest of another is not used.
pub const REMOTE_FORMAT: u32 = 1;

/// `manifest.json` of a remote dataset.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RemoteManifest {
    pub remote_format: u32,
    pub manifest: Manifest,
    pub parts: Vec<Part>,
    /// Sum of the parts' compressed sizes.
    pub compressed_bytes: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Part {
    /// Under `parts/`, e.g. `00003.zst`.
    pub name: String,
    /// Uncompressed: the sum of its chunks' lengths.
    pub raw_bytes: u64,
    /// Compressed, as stored.
    pub bytes: u64,
    pub sha256: String,
    pub chunks: Vec<Chunk>,
}

/// A range of one file (an index into the manifest's `files`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Chunk {
    pub file: usize,
    pub offset: u64,
    pub len: u64,
}

/// What a transfer moved and how long it took.
#[derive(Debug, Clone, Copy, Default)]
pub struct Transfer {
    pub raw_bytes: u64,
    pub compressed_bytes: u64,
    pub parts: usize,
    pub seconds: f64,
}

pub struct Remote {
    store: Arc<dyn ObjectStore>,
    prefix: String,
    /// `s3://bucket/prefix`, as configured.
    pub url: String,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Remote({})", self.url)
    }
}

fn remote_err(what: impl std::fmt::Display, e: impl std::fmt::Display) -> Error {
    Error::Remote(format!("{what}: {e}"))
}

impl Remote {
    /// The store at `s3://BUCKET[/PREFIX]`, with credentials, region and
    /// endpoint from the environment. Nothing is contacted yet.
    pub fn open(url: &str) -> Result<Remote> {
        let rest = url.strip_prefix("s3://").ok_or_else(|| {
            Error::Remote(format!(
                "`{url}` is not an object store URL: write s3://BUCKET/PREFIX (an S3-compatible server's address goes in AWS_ENDPOINT_URL)"
            ))
        })?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(Error::Remote(format!("`{url}` names no bucket")));
        }
        // Retries of a failing request give up within seconds: a cell then
        // builds the dataset itself instead of waiting minutes.
        let retry = object_store::RetryConfig {
            max_retries: 3,
            retry_timeout: std::time::Duration::from_secs(30),
            ..Default::default()
        };
        let mut b = object_store::aws::AmazonS3Builder::from_env()
            .with_bucket_name(bucket)
            .with_retry(retry);
        // An S3-compatible server: its address, path-style requests, and
        // plain HTTP when it says so (a test server, a cluster-local one).
        if let Some(endpoint) = std::env::var("AWS_ENDPOINT_URL")
            .ok()
            .filter(|e| !e.is_empty())
        {
            b = b
                .with_endpoint(&endpoint)
                .with_virtual_hosted_style_request(false)
                .with_allow_http(endpoint.starts_with("http://"));
        }
        let store = b.build().map_err(|e| remote_err(url, e))?;
        Ok(Remote {
            store: Arc::new(store),
            prefix: prefix.trim_matches('/').to_string(),
            url: url.to_string(),
        })
    }

    fn key(&self, fingerprint: &str, name: &str) -> Key {
        let mut k = String::new();
        if !self.prefix.is_empty() {
            k.push_str(&self.prefix);
            k.push('/');
        }
        k.push_str(fingerprint);
        k.push('/');
        k.push_str(name);
        Key::from(k)
    }

    /// The remote dataset's manifest, if one is there and this pgfleet
    /// reads its layout.
    pub async fn find(&self, fingerprint: &str) -> Result<Option<RemoteManifest>> {
        let key = self.key(fingerprint, "manifest.json");
        let bytes = match self.store.get(&key).await {
            Ok(r) => r.bytes().await.map_err(|e| remote_err(&key, e))?,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(remote_err(format!("{}/{key}", self.url), e)),
        };
        match serde_json::from_slice::<RemoteManifest>(&bytes) {
            Ok(m) if m.remote_format == REMOTE_FORMAT => Ok(Some(m)),
            Ok(_) => Ok(None),
            Err(e) => {
                tracing::warn!(%key, "unreadable remote dataset manifest, treated as absent: {e}");
                Ok(None)
            }
        }
    }

    /// Uploads the local store's published dataset `m`: parts first, the
    /// manifest last.
    pub async fn upload(
        &self,
        local: &LocalStore,
        m: &Manifest,
        cancel: &CancellationToken,
    ) -> Result<Transfer> {
        let started = Instant::now();
        let data = local.path(&m.fingerprint).join("data");
        let files = Arc::new(m.files.clone());
        // This upload's own part names: two hosts uploading one dataset at
        // once never overwrite each other's parts (the last manifest wins,
        // and refers to its own).
        let upload = hex(&Sha256::digest(format!(
            "{} {} {} {}",
            m.built_by,
            m.host,
            m.created_at,
            std::process::id()
        )))[..12]
            .to_string();
        // Each part's future owns what it uses (spawned work needs 'static).
        let jobs: Vec<_> = plan(m, &upload)
            .into_iter()
            .map(|p| {
                let (data, files, cancel) = (data.clone(), files.clone(), cancel.clone());
                let (store, url) = (self.store.clone(), self.url.clone());
                let key = self.key(&m.fingerprint, &format!("parts/{}", p.name));
                let fingerprint = m.fingerprint.clone();
                async move {
                    if cancel.is_cancelled() {
                        return Err(Error::Cancelled(
                            "cancelled while uploading a dataset".into(),
                        ));
                    }
                    let chunks = p.chunks.clone();
                    let (compressed, sha) = tokio::task::spawn_blocking(move || {
                        let mut raw = Vec::new();
                        for c in &chunks {
                            let path = data.join(&files[c.file].path);
                            let f = std::fs::File::open(&path)?;
                            let at = raw.len();
                            raw.resize(at + c.len as usize, 0);
                            f.read_exact_at(&mut raw[at..], c.offset)?;
                        }
                        let z = zstd::bulk::compress(&raw, ZSTD_LEVEL)?;
                        let sha = hex(&Sha256::digest(&z));
                        Ok::<_, std::io::Error>((z, sha))
                    })
                    .await
                    .map_err(|e| Error::Remote(format!("compressing a part: {e}")))?
                    .map_err(|e| Error::io(format!("reading dataset {fingerprint}"), e))?;
                    let bytes = compressed.len() as u64;
                    store
                        .put(&key, Bytes::from(compressed).into())
                        .await
                        .map_err(|e| remote_err(format!("uploading {url}/{key}"), e))?;
                    Ok::<_, Error>(Part {
                        bytes,
                        sha256: sha,
                        ..p
                    })
                }
            })
            .collect();
        let uploaded: Vec<Part> = futures::stream::iter(jobs)
            .buffered(PARALLEL)
            .try_collect()
            .await?;
        let remote = RemoteManifest {
            remote_format: REMOTE_FORMAT,
            manifest: m.clone(),
            compressed_bytes: uploaded.iter().map(|p| p.bytes).sum(),
            parts: uploaded,
        };
        let key = self.key(&m.fingerprint, "manifest.json");
        let json = serde_json::to_vec_pretty(&remote).map_err(|e| remote_err(&key, e))?;
        self.store
            .put(&key, Bytes::from(json).into())
            .await
            .map_err(|e| remote_err(format!("uploading {}/{key}", self.url), e))?;
        Ok(Transfer {
            raw_bytes: m.bytes,
            compressed_bytes: remote.compressed_bytes,
            parts: remote.parts.len(),
            seconds: started.elapsed().as_secs_f64(),
        })
    }

    /// Downloads `rm` into the local store and publishes it there (call
    /// with the fingerprint's exclusive lock held). A part that does not
    /// match its SHA-256 is `Error::DatasetCorrupt`; nothing half-written
    /// is left either way.
    pub async fn download(
        &self,
        rm: &RemoteManifest,
        local: &LocalStore,
        mut progress: impl FnMut(u64, u64),
        cancel: &CancellationToken,
    ) -> Result<Transfer> {
        let started = Instant::now();
        let m = &rm.manifest;
        check(rm).map_err(|detail| Error::DatasetCorrupt {
            fingerprint: m.fingerprint.clone(),
            detail: format!("its remote manifest: {detail}"),
        })?;
        let building = local
            .building_dir(&m.fingerprint)
            .map_err(|e| Error::io(format!("dataset store {}", local.dir.display()), e))?;
        let result = async {
            let data = building.join("data");
            create_files(&data, m)?;
            let files = Arc::new(m.files.clone());
            // Collected: a lazy map's closure, held across awaits, would make
            // the download's future not provably Send.
            let jobs: Vec<_> = rm
                .parts
                .iter()
                .map(|p| self.fetch_part(m, p, &data, &files, cancel))
                .collect();
            let mut parts = futures::stream::iter(jobs).buffer_unordered(PARALLEL);
            let mut done = 0;
            while let Some(n) = parts.next().await {
                done += n?;
                progress(done, m.bytes);
            }
            drop(parts);
            publish(&building, &data, m, local).await
        }
        .await;
        if let Err(e) = result {
            let _ = std::fs::remove_dir_all(&building);
            return Err(e);
        }
        Ok(Transfer {
            raw_bytes: m.bytes,
            compressed_bytes: rm.compressed_bytes,
            parts: rm.parts.len(),
            seconds: started.elapsed().as_secs_f64(),
        })
    }

    /// Downloads part `p`, checks it against the manifest and writes its
    /// chunks into the files under `data`; returns the bytes written. The
    /// future owns what it uses (spawned work needs 'static).
    fn fetch_part(
        &self,
        m: &Manifest,
        p: &Part,
        data: &Path,
        files: &Arc<Vec<pgfleet_proto::dataset::FileEntry>>,
        cancel: &CancellationToken,
    ) -> impl std::future::Future<Output = Result<u64>> + use<> {
        let (data, files, cancel) = (data.to_path_buf(), files.clone(), cancel.clone());
        let (store, url) = (self.store.clone(), self.url.clone());
        let key = self.key(&m.fingerprint, &format!("parts/{}", p.name));
        let (part, fingerprint) = (p.clone(), m.fingerprint.clone());
        async move {
            if cancel.is_cancelled() {
                return Err(Error::Cancelled(
                    "cancelled while downloading a dataset".into(),
                ));
            }
            let z = store
                .get(&key)
                .await
                .map_err(|e| match e {
                    object_store::Error::NotFound { .. } => Error::DatasetCorrupt {
                        fingerprint: fingerprint.clone(),
                        detail: format!("part {} is missing", part.name),
                    },
                    e => remote_err(format!("downloading {url}/{key}"), e),
                })?
                .bytes()
                .await
                .map_err(|e| remote_err(format!("downloading {url}/{key}"), e))?;
            tokio::task::spawn_blocking(move || write_part(&z, &part, &data, &files, &fingerprint))
                .await
                .map_err(|e| Error::Remote(format!("writing a part: {e}")))?
        }
    }

    /// Removes a remote dataset: its manifest first, so a half-removed one
    /// is never used, then its parts.
    pub async fn discard(&self, fingerprint: &str) -> Result<()> {
        let manifest = self.key(fingerprint, "manifest.json");
        match self.store.delete(&manifest).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(remote_err(format!("deleting {}/{manifest}", self.url), e)),
        }
        let dir = self.key(fingerprint, "parts");
        let keys: Vec<Key> = self
            .store
            .list(Some(&dir))
            .map_ok(|o| o.location)
            .try_collect()
            .await
            .map_err(|e| remote_err(format!("listing {}/{dir}", self.url), e))?;
        for k in keys {
            match self.store.delete(&k).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(remote_err(format!("deleting {}/{k}", self.url), e)),
            }
        }
        Ok(())
    }
}

/// The dataset's directories and its files at their full sizes (sparse),
/// under `data`, for the parts to write into.
fn create_files(data: &Path, m: &Manifest) -> Result<()> {
    let io = |what: String| move |e| Error::io(what, e);
    let mut mkdir = std::fs::DirBuilder::new();
    mkdir.mode(0o700).recursive(true);
    mkdir
        .create(data)
        .map_err(io(format!("creating {}", data.display())))?;
    for d in &m.dirs {
        mkdir
            .create(data.join(d))
            .map_err(io(format!("creating {}", data.join(d).display())))?;
    }
    for f in &m.files {
        let path = data.join(&f.path);
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .and_then(|h| h.set_len(f.bytes))
            .map_err(io(format!("creating {}", path.display())))?;
    }
    Ok(())
}

/// A downloaded part checked (size and SHA-256 as stored, size after
/// decompression) and its chunks written where they belong.
fn write_part(
    z: &[u8],
    part: &Part,
    data: &Path,
    files: &[pgfleet_proto::dataset::FileEntry],
    fingerprint: &str,
) -> Result<u64> {
    let corrupt = |detail: String| Error::DatasetCorrupt {
        fingerprint: fingerprint.to_string(),
        detail,
    };
    let sha = hex(&Sha256::digest(z));
    if z.len() as u64 != part.bytes || sha != part.sha256 {
        return Err(corrupt(format!(
            "part {} has {} bytes with SHA-256 {sha}, its manifest says {} bytes with {}",
            part.name,
            z.len(),
            part.bytes,
            part.sha256
        )));
    }
    let raw = zstd::bulk::decompress(z, part.raw_bytes as usize)
        .map_err(|e| corrupt(format!("part {}: {e}", part.name)))?;
    if raw.len() as u64 != part.raw_bytes {
        return Err(corrupt(format!(
            "part {} holds {} bytes, its manifest says {}",
            part.name,
            raw.len(),
            part.raw_bytes
        )));
    }
    let mut at = 0usize;
    for c in &part.chunks {
        let path = data.join(&files[c.file].path);
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
        f.write_all_at(&raw[at..at + c.len as usize], c.offset)
            .map_err(|e| Error::io(format!("writing {}", path.display()), e))?;
        at += c.len as usize;
    }
    Ok(part.raw_bytes)
}

/// Durable before it is published: the files synced, then the manifest
/// written and synced, then the build renamed into the store.
async fn publish(building: &Path, data: &Path, m: &Manifest, local: &LocalStore) -> Result<()> {
    let io = |what: String| move |e| Error::io(what, e);
    let files: Vec<std::path::PathBuf> = m.files.iter().map(|f| data.join(&f.path)).collect();
    tokio::task::spawn_blocking(move || {
        for p in files {
            std::fs::File::open(&p)?.sync_all()?;
        }
        Ok::<_, std::io::Error>(())
    })
    .await
    .map_err(|e| Error::Remote(format!("syncing: {e}")))?
    .map_err(io("syncing the downloaded files".into()))?;
    let manifest = building.join("manifest.json");
    let json = serde_json::to_vec_pretty(m).map_err(|e| remote_err("manifest", e))?;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&manifest)
        .map_err(io(format!("writing {}", manifest.display())))?;
    std::io::Write::write_all(&mut f, &json)
        .and_then(|()| f.sync_all())
        .map_err(io(format!("writing {}", manifest.display())))?;
    local
        .publish(building, &m.fingerprint)
        .map_err(io(format!("publishing into {}", local.dir.display())))
}

/// Cuts the dataset's files into parts of at most `PART_BYTES` (their
/// compressed sizes and SHA-256 are filled in by the upload).
fn plan(m: &Manifest, upload: &str) -> Vec<Part> {
    let mut parts: Vec<Part> = Vec::new();
    let mut current: Vec<Chunk> = Vec::new();
    let mut size = 0u64;
    let flush = |chunks: &mut Vec<Chunk>, size: &mut u64, parts: &mut Vec<Part>| {
        if chunks.is_empty() {
            return;
        }
        parts.push(Part {
            name: format!("{upload}/{:05}.zst", parts.len()),
            raw_bytes: *size,
            bytes: 0,
            sha256: String::new(),
            chunks: std::mem::take(chunks),
        });
        *size = 0;
    };
    for (i, f) in m.files.iter().enumerate() {
        let mut offset = 0;
        while offset < f.bytes {
            let len = (f.bytes - offset).min(PART_BYTES - size);
            current.push(Chunk {
                file: i,
                offset,
                len,
            });
            size += len;
            offset += len;
            if size == PART_BYTES {
                flush(&mut current, &mut size, &mut parts);
            }
        }
    }
    flush(&mut current, &mut size, &mut parts);
    parts
}

/// A remote manifest this agent can act on: its paths inside PGDATA, its
/// parts' ranges inside their files and covering them exactly.
fn check(rm: &RemoteManifest) -> std::result::Result<(), String> {
    let m = &rm.manifest;
    let inside = |p: &str| {
        !p.is_empty()
            && Path::new(p)
                .components()
                .all(|c| matches!(c, Component::Normal(_)))
    };
    if let Some(p) = m
        .dirs
        .iter()
        .chain(m.files.iter().map(|f| &f.path))
        .find(|p| !inside(p))
    {
        return Err(format!("`{p}` is not a path inside PGDATA"));
    }
    let mut covered = vec![0u64; m.files.len()];
    for p in &rm.parts {
        if p.raw_bytes > PART_BYTES
            || p.chunks.iter().map(|c| c.len).sum::<u64>() != p.raw_bytes
            || !p.name.ends_with(".zst")
            || !inside(&p.name)
        {
            return Err(format!("part `{}` is malformed", p.name));
        }
        for c in &p.chunks {
            let Some(f) = m.files.get(c.file) else {
                return Err(format!(
                    "part `{}` names file {} of {}",
                    p.name,
                    c.file,
                    m.files.len()
                ));
            };
            if c.offset.checked_add(c.len).is_none_or(|end| end > f.bytes) {
                return Err(format!(
                    "part `{}` writes past the end of {}",
                    p.name, f.path
                ));
            }
            covered[c.file] += c.len;
        }
    }
    match m.files.iter().zip(&covered).find(|(f, n)| f.bytes != **n) {
        Some((f, n)) => Err(format!(
            "its parts hold {n} bytes of {}, which has {}",
            f.path, f.bytes
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pgfleet_proto::dataset::FileEntry;

    fn manifest(sizes: &[u64]) -> Manifest {
        let text = r#"{"store_format":1,"fingerprint":"f",
            "dataset":{"loader":"l","loader_version":1,"label":"x","keys":{},"bytes":0,"load_seconds":0.0},
            "format":{"postgres_major":15,"block_size_kb":8,"wal_block_size_kb":8,"segment_size_gb":1,"checksums":false,"encoding":"UTF8","locale":"C"},
            "postgres_version":"15","created_at":0,"built_by":"c","host":"h","build_seconds":0.0,"publish_seconds":0.0,"load":null,
            "superuser_password":"p","dirs":[],"files":[],"bytes":0}"#;
        let mut m: Manifest = serde_json::from_str(text).unwrap();
        m.files = sizes
            .iter()
            .enumerate()
            .map(|(i, b)| FileEntry {
                path: format!("base/{i}"),
                bytes: *b,
                sha256: String::new(),
            })
            .collect();
        m.bytes = sizes.iter().sum();
        m
    }

    #[test]
    fn files_are_cut_into_parts_that_cover_them_exactly() {
        let m = manifest(&[10, PART_BYTES + 5, 0, 3]);
        let parts = plan(&m, "u1");
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[1].name, "u1/00001.zst");
        assert_eq!(parts[0].raw_bytes, PART_BYTES);
        assert_eq!(parts[1].raw_bytes, 5 + 10 + 3);
        assert_eq!(parts[0].chunks[1].len, PART_BYTES - 10);
        assert_eq!(
            (parts[1].chunks[0].file, parts[1].chunks[0].offset),
            (1, PART_BYTES - 10)
        );
        let rm = RemoteManifest {
            remote_format: REMOTE_FORMAT,
            manifest: m.clone(),
            parts,
            compressed_bytes: 0,
        };
        assert_eq!(check(&rm), Ok(()));
    }

    /// A manifest from the bucket is not trusted: no path out of PGDATA,
    /// no range past a file, no file left short.
    #[test]
    fn a_hostile_manifest_is_refused() {
        let m = manifest(&[10]);
        let good = RemoteManifest {
            remote_format: REMOTE_FORMAT,
            parts: plan(&m, "u1"),
            manifest: m,
            compressed_bytes: 0,
        };
        let mut bad = good.clone();
        bad.manifest.files[0].path = "../../etc/cron.d/x".into();
        assert!(
            check(&bad)
                .unwrap_err()
                .contains("not a path inside PGDATA")
        );
        let mut bad = good.clone();
        bad.manifest.dirs.push("/etc".into());
        assert!(check(&bad).is_err());
        let mut bad = good.clone();
        bad.parts[0].chunks[0].offset = 5;
        assert!(check(&bad).unwrap_err().contains("past the end"));
        let mut bad = good.clone();
        bad.parts[0].chunks[0].file = 7;
        assert!(check(&bad).is_err());
        let mut bad = good.clone();
        bad.parts.clear();
        assert!(check(&bad).unwrap_err().contains("hold 0 bytes"));
        let mut bad = good;
        bad.parts[0].name = "../x.zst".into();
        assert!(check(&bad).is_err());
    }
}
