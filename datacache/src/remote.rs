//! Remote data sets through the `object_store` crate: S3, GCS, Azure, plain HTTP(S), local
//! files and memory behind one [`ObjectStoreSource`]. This is the slow level of Fig. 5
//! (MSTopK/HiTopKComm, Shi et al., MLSys 2021, §4.1), where the paper's training data sits on
//! a networked file system.
//!
//! `object_store` is asynchronous; a [`Source`] is read from the loader's plain worker threads.
//! Requests therefore run on one small process-wide Tokio runtime and the calling thread waits
//! for the answer over a channel, which works from any thread (also one inside another Tokio
//! runtime, where `block_on` would panic).
//!
//! Every request has a deadline ([`RemoteConfig::timeout`]) and transient failures
//! (timeouts, connection errors, server errors, short bodies) are retried with exponential
//! backoff up to [`RemoteConfig::attempts`] times; the error that is finally returned says how
//! many attempts were made and why the last one failed ([`RemoteError`]). A missing object or
//! a refused credential is not retried.
//!
//! Which URL schemes [`ObjectStoreSource::open_url`] accepts depends on cargo features, so
//! that the default build carries no HTTP or TLS stack: `file://` and `memory://` always,
//! `http(s)://` with `http`, `s3://` with `aws`, `gs://` with `gcp`, `az://` and Azure hosts
//! with `azure`. Any store built by hand can be passed to [`ObjectStoreSource::list`].

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures_util::StreamExt;
use object_store::path::Path as ObjPath;
use object_store::{ObjectStore, ObjectStoreExt, ObjectStoreScheme};

use crate::error::{Error, Result};
use crate::source::{check_index, Source};

/// Deadlines and retries for remote reads.
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteConfig {
    /// Tries per request (≥ 1); transient failures are retried until this many were made.
    pub attempts: u32,
    /// Deadline of one attempt (connect, headers and whole body).
    pub timeout: Duration,
    /// Wait before the first retry; doubled for each further one.
    pub backoff: Duration,
    /// Largest object accepted, in bytes; a larger one is [`RemoteError::TooLarge`] before
    /// its body is read, so a wrong object cannot exhaust memory.
    pub max_object_bytes: u64,
}

impl Default for RemoteConfig {
    fn default() -> Self {
        Self {
            attempts: 4,
            timeout: Duration::from_secs(30),
            backoff: Duration::from_millis(50),
            max_object_bytes: 1 << 30,
        }
    }
}

impl RemoteConfig {
    fn validate(&self) -> Result<()> {
        if self.attempts == 0 {
            return Err(Error::Config(
                "RemoteConfig::attempts must be at least 1".into(),
            ));
        }
        if self.timeout.is_zero() {
            return Err(Error::Config(
                "RemoteConfig::timeout must be positive".into(),
            ));
        }
        Ok(())
    }
}

/// Why a remote request failed.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// The object (or prefix) does not exist.
    #[error("object not found: {0}")]
    NotFound(String),
    /// No complete answer within the deadline.
    #[error("no complete answer within {0:?}")]
    Timeout(Duration),
    /// The object is larger than [`RemoteConfig::max_object_bytes`].
    #[error("object is {size} bytes, more than the limit of {limit}")]
    TooLarge {
        /// Its size.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// The body ended before the length the server announced (a dropped connection).
    #[error("body of {got} bytes, {expected} announced")]
    ShortBody {
        /// Bytes announced.
        expected: u64,
        /// Bytes received.
        got: u64,
    },
    /// The object's size differs from the one listed when the data set was opened: the data
    /// set changed underneath the run.
    #[error("object is {now} bytes, {listed} when the data set was listed")]
    Changed {
        /// Size at listing time.
        listed: u64,
        /// Size now.
        now: u64,
    },
    /// Any other store error (permissions, credentials, a server error, a bad path).
    #[error(transparent)]
    Store(object_store::Error),
    /// The I/O runtime could not be started or lost the request.
    #[error("I/O runtime: {0}")]
    Runtime(String),
}

impl RemoteError {
    /// Whether trying again may help.
    pub fn is_transient(&self) -> bool {
        use object_store::Error as E;
        match self {
            Self::Timeout(_) | Self::ShortBody { .. } => true,
            Self::Store(e) => matches!(e, E::Generic { .. } | E::JoinError { .. }),
            Self::NotFound(_) | Self::TooLarge { .. } | Self::Changed { .. } | Self::Runtime(_) => {
                false
            }
        }
    }
}

impl From<object_store::Error> for RemoteError {
    fn from(e: object_store::Error) -> Self {
        match e {
            object_store::Error::NotFound { path, .. } => Self::NotFound(path),
            e => Self::Store(e),
        }
    }
}

fn runtime() -> std::result::Result<&'static tokio::runtime::Runtime, RemoteError> {
    static RUNTIME: OnceLock<std::result::Result<tokio::runtime::Runtime, String>> =
        OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("datacache-io")
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| RemoteError::Runtime(e.clone()))
}

/// Runs `fut` on the I/O runtime and waits for it on this thread.
fn wait<T: Send + 'static>(
    fut: impl Future<Output = T> + Send + 'static,
) -> std::result::Result<T, RemoteError> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    runtime()?.spawn(async move {
        let _ = tx.send(fut.await);
    });
    rx.recv()
        .map_err(|_| RemoteError::Runtime("the request's task ended without an answer".into()))
}

/// Runs `op` with the deadline and retry policy of `cfg`: the number of attempts made and the
/// last outcome.
async fn with_retries<T, F, Fut>(
    cfg: &RemoteConfig,
    mut op: F,
) -> (u32, std::result::Result<T, RemoteError>)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = std::result::Result<T, RemoteError>>,
{
    let mut backoff = cfg.backoff;
    let mut attempt = 1;
    loop {
        let outcome = match tokio::time::timeout(cfg.timeout, op()).await {
            Ok(r) => r,
            Err(_) => Err(RemoteError::Timeout(cfg.timeout)),
        };
        match outcome {
            Err(e) if e.is_transient() && attempt < cfg.attempts => {
                tracing::debug!(attempt, error = %e, "remote request failed, retrying");
                tokio::time::sleep(backoff).await;
                backoff = backoff.saturating_mul(2);
                attempt += 1;
            }
            r => return (attempt, r),
        }
    }
}

/// One GET of a whole object, checked against the size limit and the listed size.
async fn get_once(
    store: &dyn ObjectStore,
    location: &ObjPath,
    listed: Option<u64>,
    limit: u64,
) -> std::result::Result<Vec<u8>, RemoteError> {
    let r = store.get(location).await?;
    let size = r.meta.size;
    if size > limit {
        return Err(RemoteError::TooLarge { size, limit });
    }
    if let Some(listed) = listed.filter(|&l| l != size) {
        return Err(RemoteError::Changed { listed, now: size });
    }
    let expected = r.range.end.saturating_sub(r.range.start);
    let bytes = r.bytes().await?;
    if bytes.len() as u64 != expected {
        return Err(RemoteError::ShortBody {
            expected,
            got: bytes.len() as u64,
        });
    }
    Ok(bytes.to_vec())
}

/// One object of the data set.
#[derive(Debug, Clone)]
struct Object {
    location: ObjPath,
    /// Size when listed; `None` for objects named by a manifest (checked on read only
    /// against the server's own length).
    size: Option<u64>,
    label: Option<u32>,
}

/// A data set of one object per sample in an object store, in the layout of
/// [`crate::FolderSource`]: `prefix/<class>/…/<file>`, classes in sorted order (label =
/// position), samples in sorted key order, so every machine numbers them alike. Objects
/// directly under the prefix have no label; keys with a part starting with `.` are ignored.
#[derive(Debug, Clone)]
pub struct ObjectStoreSource {
    store: Arc<dyn ObjectStore>,
    id: String,
    prefix: ObjPath,
    classes: Vec<String>,
    objects: Vec<Object>,
    listing_crc: u32,
    cfg: RemoteConfig,
}

impl ObjectStoreSource {
    /// Lists every object under `prefix` of `store` (with the deadline and retries of
    /// `cfg`). An empty listing is an error: it is almost always a wrong prefix.
    pub fn list(store: Arc<dyn ObjectStore>, prefix: &str, cfg: RemoteConfig) -> Result<Self> {
        cfg.validate()?;
        let id = store.to_string();
        let prefix = parse_prefix(&id, prefix)?;
        let (s, p, c) = (store.clone(), prefix.clone(), cfg.clone());
        let listed = wait(async move {
            with_retries(&c, || {
                let (s, p) = (s.clone(), p.clone());
                async move {
                    let mut out = Vec::new();
                    let mut stream = s.list(Some(&p));
                    while let Some(meta) = stream.next().await {
                        out.push(meta?);
                    }
                    Ok(out)
                }
            })
            .await
        });
        let metas = match listed {
            Ok((_, Ok(m))) => m,
            Ok((_, Err(e))) | Err(e) => {
                return Err(Error::Store {
                    url: format!("{id}/{prefix}"),
                    source: e,
                })
            }
        };
        let mut keys: Vec<(Vec<String>, ObjPath, u64)> = metas
            .into_iter()
            .filter_map(|m| {
                let rel: Vec<String> = m
                    .location
                    .prefix_match(&prefix)?
                    .map(|p| p.as_ref().to_string())
                    .collect();
                (!rel.is_empty() && !rel.iter().any(|p| p.starts_with('.')))
                    .then_some((rel, m.location, m.size))
            })
            .collect();
        keys.sort_by(|a, b| a.1.cmp(&b.1));
        let mut classes: Vec<String> = keys
            .iter()
            .filter(|k| k.0.len() > 1)
            .map(|k| k.0[0].clone())
            .collect();
        classes.dedup();
        let mut objects = Vec::with_capacity(keys.len());
        for (rel, location, size) in keys {
            let label = if rel.len() > 1 {
                let pos = classes.binary_search(&rel[0]).unwrap_or(0);
                Some(
                    u32::try_from(pos)
                        .map_err(|_| Error::Config("more than u32::MAX classes".into()))?,
                )
            } else {
                None
            };
            objects.push(Object {
                location,
                size: Some(size),
                label,
            });
        }
        Self::new(store, id, prefix, classes, objects, cfg)
    }

    /// A data set named by a manifest instead of a listing (for stores that cannot list,
    /// such as a plain HTTP server): `keys` are paths under `prefix` with their labels, in
    /// sample order. Nothing is requested until a sample is read.
    pub fn from_keys<K: AsRef<str>>(
        store: Arc<dyn ObjectStore>,
        prefix: &str,
        keys: impl IntoIterator<Item = (K, Option<u32>)>,
        cfg: RemoteConfig,
    ) -> Result<Self> {
        cfg.validate()?;
        let id = store.to_string();
        let prefix = parse_prefix(&id, prefix)?;
        let mut objects = Vec::new();
        for (key, label) in keys {
            let key = key.as_ref();
            let rel = ObjPath::parse(key).map_err(|e| Error::Url {
                url: key.to_string(),
                reason: format!("not a valid object key: {e}"),
            })?;
            let location = rel.parts().fold(prefix.clone(), |p, part| p.join(part));
            objects.push(Object {
                location,
                size: None,
                label,
            });
        }
        Self::new(store, id, prefix, Vec::new(), objects, cfg)
    }

    /// Opens the store a URL names (see the module docs for the schemes and their features)
    /// and lists the objects under its path.
    pub fn open_url(url: &str, cfg: RemoteConfig) -> Result<Self> {
        let (store, prefix) = store_for_url(url, &cfg)?;
        let mut s = Self::list(store, prefix.as_ref(), cfg)?;
        s.id = url.trim_end_matches('/').to_string();
        Ok(s)
    }

    fn new(
        store: Arc<dyn ObjectStore>,
        id: String,
        prefix: ObjPath,
        classes: Vec<String>,
        objects: Vec<Object>,
        cfg: RemoteConfig,
    ) -> Result<Self> {
        if objects.is_empty() {
            return Err(Error::Store {
                url: format!("{id}/{prefix}"),
                source: RemoteError::NotFound(format!("no objects under {prefix:?}")),
            });
        }
        let mut h = crc32fast::Hasher::new();
        for o in &objects {
            h.update(o.location.as_ref().as_bytes());
            h.update(&o.size.unwrap_or(u64::MAX).to_le_bytes());
            h.update(&o.label.unwrap_or(u32::MAX).to_le_bytes());
        }
        Ok(Self {
            store,
            id,
            prefix,
            classes,
            objects,
            listing_crc: h.finalize(),
            cfg,
        })
    }

    /// Names the data set (default: the store's `Display`, or the URL given to
    /// [`ObjectStoreSource::open_url`]); the name enters [`Source::fingerprint`], so give two
    /// stores that print alike (two HTTP servers) different names.
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.id = id.into();
        self
    }

    /// The class names, in label order (empty for a manifest).
    pub fn classes(&self) -> &[String] {
        &self.classes
    }

    /// The object key of sample `index`, if in range.
    pub fn location(&self, index: usize) -> Option<&str> {
        self.objects.get(index).map(|o| o.location.as_ref())
    }

    /// The deadline and retry policy in force.
    pub fn config(&self) -> &RemoteConfig {
        &self.cfg
    }
}

fn parse_prefix(id: &str, prefix: &str) -> Result<ObjPath> {
    ObjPath::parse(prefix.trim_matches('/')).map_err(|e| Error::Url {
        url: format!("{id}/{prefix}"),
        reason: format!("not a valid object prefix: {e}"),
    })
}

impl Source for ObjectStoreSource {
    fn len(&self) -> usize {
        self.objects.len()
    }

    fn read(&self, index: usize) -> Result<Vec<u8>> {
        check_index(index, self.objects.len())?;
        let o = self.objects[index].clone();
        let (store, cfg) = (self.store.clone(), self.cfg.clone());
        let outcome = wait(async move {
            with_retries(&cfg, || {
                get_once(store.as_ref(), &o.location, o.size, cfg.max_object_bytes)
            })
            .await
        });
        let (attempts, source) = match outcome {
            Ok((_, Ok(bytes))) => return Ok(bytes),
            Ok((attempts, Err(e))) => (attempts, e),
            Err(e) => (0, e),
        };
        Err(Error::Remote {
            index,
            name: self.name(index),
            attempts,
            source,
        })
    }

    fn name(&self, index: usize) -> String {
        match self.objects.get(index) {
            Some(o) => format!("{}:{}", self.id, o.location),
            None => format!("#{index} (out of range)"),
        }
    }

    fn label(&self, index: usize, _raw: &[u8]) -> Option<u32> {
        self.objects.get(index).and_then(|o| o.label)
    }

    fn fingerprint(&self) -> String {
        format!(
            "object_store:{}:{}:{}:{:08x}",
            self.id,
            self.prefix,
            self.objects.len(),
            self.listing_crc
        )
    }
}

/// The store and the path inside it that `url` names. See the module docs for the schemes;
/// one whose cargo feature is off is [`Error::Url`] naming the feature. Cloud stores take
/// their credentials and region from the environment (`AWS_*`, `GOOGLE_*`, `AZURE_*`), as
/// `object_store`'s builders read them.
pub fn store_for_url(url: &str, cfg: &RemoteConfig) -> Result<(Arc<dyn ObjectStore>, ObjPath)> {
    let bad = |reason: String| Error::Url {
        url: url.to_string(),
        reason,
    };
    let parsed = url::Url::parse(url).map_err(|e| bad(e.to_string()))?;
    let (scheme, path) = ObjectStoreScheme::parse(&parsed).map_err(|e| bad(e.to_string()))?;
    let feature = match scheme {
        ObjectStoreScheme::Local => {
            let store = object_store::local::LocalFileSystem::new();
            return Ok((Arc::new(store), path));
        }
        ObjectStoreScheme::Memory => {
            return Ok((Arc::new(object_store::memory::InMemory::new()), path));
        }
        ObjectStoreScheme::Http => "http",
        ObjectStoreScheme::AmazonS3 => "aws",
        ObjectStoreScheme::GoogleCloudStorage => "gcp",
        ObjectStoreScheme::MicrosoftAzure => "azure",
        _ => return Err(bad("unsupported object-store scheme".into())),
    };
    let enabled = match feature {
        "http" => cfg!(feature = "http"),
        "aws" => cfg!(feature = "aws"),
        "gcp" => cfg!(feature = "gcp"),
        _ => cfg!(feature = "azure"),
    };
    if !enabled {
        return Err(bad(format!(
            "this build of datacache has no `{feature}` feature (cargo build --features {feature})"
        )));
    }
    #[cfg(feature = "http")]
    if scheme == ObjectStoreScheme::Http {
        let store = http_store(&parsed[..url::Position::BeforePath], cfg)?;
        return Ok((store, path));
    }
    let timeout = format!("{}ms", cfg.timeout.as_millis());
    let options = std::env::vars()
        .map(|(k, v)| (k.to_ascii_lowercase(), v))
        .chain([("timeout".to_string(), timeout)]);
    let (store, path) =
        object_store::parse_url_opts(&parsed, options).map_err(|e| bad(e.to_string()))?;
    Ok((Arc::from(store), path))
}

/// An HTTP(S) store rooted at `base` (`scheme://host:port`), with `cfg`'s deadline as the
/// client's timeout and the retries left to this crate's own loop (one policy, one count).
#[cfg(feature = "http")]
pub fn http_store(base: &str, cfg: &RemoteConfig) -> Result<Arc<dyn ObjectStore>> {
    use object_store::{ClientOptions, RetryConfig};
    let options = ClientOptions::new()
        .with_allow_http(true)
        .with_timeout(cfg.timeout)
        .with_connect_timeout(cfg.timeout);
    let retry = RetryConfig {
        max_retries: 0,
        ..RetryConfig::default()
    };
    let store = object_store::http::HttpBuilder::new()
        .with_url(base)
        .with_client_options(options)
        .with_retry(retry)
        .build()
        .map_err(|e| Error::Url {
            url: base.to_string(),
            reason: e.to_string(),
        })?;
    Ok(Arc::new(store))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn cfg(attempts: u32) -> RemoteConfig {
        RemoteConfig {
            attempts,
            timeout: Duration::from_millis(200),
            backoff: Duration::from_millis(1),
            max_object_bytes: 1 << 20,
        }
    }

    /// An operation that fails `fails` times with `err()` and then succeeds.
    fn flaky(
        cfg: RemoteConfig,
        fails: u32,
        err: fn() -> RemoteError,
    ) -> (u32, u32, std::result::Result<u32, RemoteError>) {
        let calls = Arc::new(AtomicU32::new(0));
        let c = calls.clone();
        let (attempts, r) = wait(async move {
            with_retries(&cfg, || {
                let n = c.fetch_add(1, Ordering::SeqCst);
                async move {
                    if n < fails {
                        Err(err())
                    } else {
                        Ok(n)
                    }
                }
            })
            .await
        })
        .unwrap();
        (attempts, calls.load(Ordering::SeqCst), r)
    }

    #[test]
    fn transient_failures_are_retried_up_to_the_limit() {
        let short = || RemoteError::ShortBody {
            expected: 2,
            got: 1,
        };
        let (attempts, calls, r) = flaky(cfg(4), 3, short);
        assert_eq!((attempts, calls, r.unwrap()), (4, 4, 3));
        let (attempts, calls, r) = flaky(cfg(3), 3, short);
        assert_eq!((attempts, calls), (3, 3));
        assert!(matches!(r, Err(RemoteError::ShortBody { .. })));
    }

    #[test]
    fn permanent_failures_are_not_retried() {
        let (attempts, calls, r) = flaky(cfg(5), 1, || RemoteError::NotFound("x".into()));
        assert_eq!((attempts, calls), (1, 1));
        assert!(matches!(r, Err(RemoteError::NotFound(_))));
    }

    #[test]
    fn a_stalled_attempt_times_out_and_is_retried() {
        let calls = Arc::new(AtomicU32::new(0));
        let c = calls.clone();
        let t = std::time::Instant::now();
        let (attempts, r) = wait(async move {
            with_retries(&cfg(2), || {
                let n = c.fetch_add(1, Ordering::SeqCst);
                async move {
                    if n == 0 {
                        tokio::time::sleep(Duration::from_secs(30)).await;
                    }
                    Ok::<_, RemoteError>(n)
                }
            })
            .await
        })
        .unwrap();
        assert_eq!((attempts, r.unwrap()), (2, 1));
        assert!(t.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn bad_configs_are_rejected() {
        assert!(matches!(cfg(0).validate(), Err(Error::Config(_))));
        let zero = RemoteConfig {
            timeout: Duration::ZERO,
            ..cfg(1)
        };
        assert!(matches!(zero.validate(), Err(Error::Config(_))));
    }

    #[test]
    fn waiting_works_inside_another_runtime() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let v = rt.block_on(async { wait(async { 7 }) }).unwrap();
        assert_eq!(v, 7);
    }
}
