//! `ObjectStoreSource` against `object_store`'s in-memory and local-file stores, through the
//! whole cache; deadlines against its throttled store; URL parsing. The HTTP store against a
//! real server is in `remote_http.rs` (feature `bench`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use datacache::remote::store_for_url;
use datacache::{
    DataCache, Error, Loader, LoaderConfig, ObjectStoreSource, RemoteConfig, RemoteError,
    ShardPlan, Source, Tensor,
};
use object_store::memory::InMemory;
use object_store::path::Path as ObjPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

fn quick() -> RemoteConfig {
    RemoteConfig {
        attempts: 3,
        timeout: Duration::from_millis(300),
        backoff: Duration::from_millis(1),
        max_object_bytes: 1 << 20,
    }
}

/// Sample `i`'s bytes: they say which sample they are.
fn body(i: usize) -> Vec<u8> {
    let mut v = vec![(i % 251) as u8; 64 + i];
    v[..8].copy_from_slice(&(i as u64).to_le_bytes());
    v
}

/// Any length of bytes, one value each.
fn bytes_decoder(raw: &[u8]) -> Result<Tensor, String> {
    Ok(Tensor {
        shape: vec![raw.len()],
        data: raw.iter().map(|&b| f32::from(b)).collect(),
    })
}

fn put(store: &dyn ObjectStore, key: &str, bytes: Vec<u8>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(store.put(&ObjPath::from(key), PutPayload::from(bytes)))
        .unwrap();
}

/// `n` samples in 3 classes under `data/`, plus noise that must not be picked up.
fn fill(store: &dyn ObjectStore, n: usize) {
    for i in 0..n {
        put(store, &format!("data/c{}/{i:04}.bin", i % 3), body(i));
    }
    put(store, "data/.hidden/x.bin", vec![1]);
    put(store, "other/c0/9999.bin", vec![2]);
}

fn check_layout(src: &ObjectStoreSource, n: usize) {
    assert_eq!(src.len(), n);
    assert_eq!(src.classes(), ["c0", "c1", "c2"]);
    // Sorted by key: class c0 first.
    let mut seen = Vec::new();
    for k in 0..n {
        let raw = src.read(k).unwrap();
        let i = u64::from_le_bytes(raw[..8].try_into().unwrap()) as usize;
        assert_eq!(raw, body(i));
        assert_eq!(src.label(k, &raw), Some((i % 3) as u32));
        assert!(src.location(k).unwrap().ends_with(&format!("{i:04}.bin")));
        seen.push(i);
    }
    seen.sort();
    assert_eq!(seen, (0..n).collect::<Vec<_>>());
}

#[test]
fn in_memory_store_lists_classes_and_reads() {
    let store = Arc::new(InMemory::new());
    fill(store.as_ref(), 20);
    let src = ObjectStoreSource::list(store, "data", quick()).unwrap();
    check_layout(&src, 20);
    assert!(matches!(src.read(20), Err(Error::IndexOutOfRange { .. })));
}

#[test]
fn local_file_store_and_file_url_read_real_files() {
    let t = tempfile::tempdir().unwrap();
    let store = Arc::new(object_store::local::LocalFileSystem::new_with_prefix(t.path()).unwrap());
    fill(store.as_ref(), 15);
    let src = ObjectStoreSource::list(store, "data", quick()).unwrap();
    check_layout(&src, 15);
    let url = format!("file://{}/data", t.path().display());
    let by_url = ObjectStoreSource::open_url(&url, quick()).unwrap();
    check_layout(&by_url, 15);
    // Different ids, same listing: different disk namespaces.
    assert_ne!(src.fingerprint(), by_url.fingerprint());
}

#[test]
fn a_remote_data_set_goes_through_disk_and_memory() {
    let t = tempfile::tempdir().unwrap();
    let store = Arc::new(InMemory::new());
    let n = 30;
    fill(store.as_ref(), n);
    let make = || {
        let src = ObjectStoreSource::list(store.clone(), "data", quick()).unwrap();
        Arc::new(
            DataCache::builder(src, bytes_decoder)
                .disk(t.path(), 1 << 20)
                .memory(1 << 20)
                .build()
                .unwrap(),
        )
    };
    let cfg = LoaderConfig {
        batch_size: 7,
        seed: 3,
        workers: 2,
        ..LoaderConfig::default()
    };
    let first = make();
    let loader = Loader::new(first.clone(), ShardPlan::single(n), cfg.clone()).unwrap();
    for b in loader.epoch(0) {
        for s in b.unwrap().samples {
            assert_eq!(s.tensor.data.len(), first.get_raw(s.index).unwrap().len());
        }
    }
    assert_eq!(first.stats().source_reads, n as u64);
    // A new run reads the disk only, and gets the same bytes as the store has.
    let second = make();
    for k in 0..n {
        let raw = second.get_raw(k).unwrap();
        assert_eq!(raw, second.source().read(k).unwrap());
    }
    let s = second.stats();
    assert_eq!(
        (s.disk_hits, s.source_reads, s.disk_corrupt),
        (n as u64, 0, 0)
    );
}

#[test]
fn missing_objects_and_prefixes_are_typed_errors() {
    let store = Arc::new(InMemory::new());
    fill(store.as_ref(), 4);
    // An empty prefix listing.
    let e = ObjectStoreSource::list(store.clone(), "nothing/here", quick()).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Store {
                source: RemoteError::NotFound(_),
                ..
            }
        ),
        "{e}"
    );
    // A manifest naming an object that is not there: not retried.
    let src = ObjectStoreSource::from_keys(
        store.clone(),
        "data",
        [("c0/0000.bin", Some(0)), ("c1/gone.bin", Some(1))],
        quick(),
    )
    .unwrap();
    assert_eq!(src.read(0).unwrap(), body(0));
    let e = src.read(1).unwrap_err();
    assert_eq!(e.sample_index(), Some(1));
    match e {
        Error::Remote {
            attempts,
            source: RemoteError::NotFound(_),
            ref name,
            ..
        } => {
            assert_eq!(attempts, 1);
            assert!(name.contains("gone.bin"));
        }
        other => panic!("wrong error {other}"),
    }
    // A bad object key in a manifest.
    let bad = ObjectStoreSource::from_keys(store, "data", [("a//b", None)], quick());
    assert!(matches!(bad, Err(Error::Url { .. })));
}

#[test]
fn objects_over_the_size_limit_are_refused_before_reading() {
    let store = Arc::new(InMemory::new());
    put(store.as_ref(), "big/c0/x.bin", vec![0; 4096]);
    let cfg = RemoteConfig {
        max_object_bytes: 1000,
        ..quick()
    };
    let src = ObjectStoreSource::list(store, "big", cfg).unwrap();
    let e = src.read(0).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Remote {
                attempts: 1,
                source: RemoteError::TooLarge {
                    size: 4096,
                    limit: 1000
                },
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn an_object_that_changed_since_listing_is_an_error() {
    let store = Arc::new(InMemory::new());
    put(store.as_ref(), "d/c0/x.bin", vec![0; 10]);
    let src = ObjectStoreSource::list(store.clone(), "d", quick()).unwrap();
    put(store.as_ref(), "d/c0/x.bin", vec![0; 11]);
    assert!(matches!(
        src.read(0),
        Err(Error::Remote {
            source: RemoteError::Changed {
                listed: 10,
                now: 11
            },
            ..
        })
    ));
}

#[test]
fn a_slow_store_times_out_after_every_attempt() {
    use object_store::throttle::{ThrottleConfig, ThrottledStore};
    let inner = InMemory::new();
    put(&inner, "d/c0/x.bin", vec![1; 10]);
    let slow = ThrottledStore::new(
        inner,
        ThrottleConfig {
            wait_get_per_call: Duration::from_secs(20),
            ..ThrottleConfig::default()
        },
    );
    let src = ObjectStoreSource::list(Arc::new(slow), "d", quick()).unwrap();
    let t = Instant::now();
    let e = src.read(0).unwrap_err();
    let took = t.elapsed();
    assert!(
        matches!(
            e,
            Error::Remote {
                attempts: 3,
                source: RemoteError::Timeout(_),
                ..
            }
        ),
        "{e}"
    );
    // 3 × 300 ms plus backoff, far below the store's 20 s.
    assert!(took < Duration::from_secs(10), "took {took:?}");
}

#[test]
fn urls_without_their_feature_or_malformed_are_typed_errors() {
    for url in ["not a url", "ftp://host/x", "memory://host/x"] {
        assert!(
            matches!(store_for_url(url, &quick()), Err(Error::Url { .. })),
            "{url}"
        );
    }
    for (url, feature, on) in [
        ("s3://bucket/prefix", "aws", cfg!(feature = "aws")),
        ("gs://bucket/prefix", "gcp", cfg!(feature = "gcp")),
        ("az://container/prefix", "azure", cfg!(feature = "azure")),
        ("http://127.0.0.1:9/prefix", "http", cfg!(feature = "http")),
    ] {
        match store_for_url(url, &quick()) {
            Err(Error::Url { reason, .. }) if !on => assert!(reason.contains(feature), "{reason}"),
            Ok((_, path)) if on => assert_eq!(path.as_ref(), "prefix"),
            // With the feature on, building may still need credentials from the environment.
            Err(Error::Url { .. }) if on && feature != "http" => {}
            other => panic!("{url}: {:?}", other.map(|(_, p)| p)),
        }
    }
    let (_, path) = store_for_url("memory:///a/b", &quick()).unwrap();
    assert_eq!(path.as_ref(), "a/b");
}
