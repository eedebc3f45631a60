//! `object_store`'s HTTP store against a real HTTP server on 127.0.0.1 (the bench's
//! `LoopbackServer`), with injected server faults: retries, deadlines and typed errors over
//! real TCP. Needs the `bench` feature (which brings `http`):
//! `cargo test -p datacache --features bench --test remote_http`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use datacache::bench_support::{self, BenchConfig, Fault, LoopbackServer};
use datacache::remote::{http_store, store_for_url};
use datacache::{
    DataCache, Error, ObjectStoreSource, RemoteConfig, RemoteError, Source, U8Decoder,
};

fn quick(attempts: u32) -> RemoteConfig {
    RemoteConfig {
        attempts,
        timeout: Duration::from_millis(500),
        backoff: Duration::from_millis(1),
        max_object_bytes: 1 << 20,
    }
}

fn body(i: usize) -> Vec<u8> {
    (0..1000).map(|j| ((i * 31 + j) % 256) as u8).collect()
}

/// A server holding `n` objects `set/<i>.bin` and a source over them.
fn serve(n: usize, cfg: RemoteConfig) -> (LoopbackServer, ObjectStoreSource) {
    let server = LoopbackServer::start().unwrap();
    for i in 0..n {
        server.put(&format!("set/{i}.bin"), body(i));
    }
    let store = http_store(&server.url(), &cfg).unwrap();
    let keys: Vec<_> = (0..n)
        .map(|i| (format!("{i}.bin"), Some(i as u32 % 2)))
        .collect();
    let src = ObjectStoreSource::from_keys(store, "set", keys, cfg)
        .unwrap()
        .with_id(server.url());
    (server, src)
}

#[test]
fn reads_over_http_match_the_server() {
    let (server, src) = serve(12, quick(1));
    for i in 0..12 {
        assert_eq!(src.read(i).unwrap(), body(i));
    }
    assert_eq!(server.requests(), 12);
}

#[test]
fn server_errors_and_cut_bodies_are_retried() {
    let (server, src) = serve(3, quick(4));
    server.inject([Fault::Status(503), Fault::ShortBody, Fault::Status(500)]);
    let before = server.requests();
    assert_eq!(src.read(1).unwrap(), body(1));
    assert_eq!(
        server.requests() - before,
        4,
        "three failures, then the answer"
    );
}

#[test]
fn retries_stop_at_the_limit_with_a_typed_error() {
    let (server, src) = serve(3, quick(3));
    server.inject(std::iter::repeat_n(Fault::Status(503), 5));
    let before = server.requests();
    let e = src.read(2).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Remote {
                index: 2,
                attempts: 3,
                source: RemoteError::Store(_),
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(server.requests() - before, 3);
}

#[test]
fn a_missing_object_is_not_retried() {
    let server = LoopbackServer::start().unwrap();
    let cfg = quick(5);
    let store = http_store(&server.url(), &cfg).unwrap();
    let src = ObjectStoreSource::from_keys(store, "set", [("nope.bin", None)], cfg).unwrap();
    let e = src.read(0).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Remote {
                attempts: 1,
                source: RemoteError::NotFound(_),
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(server.requests(), 1);
}

#[test]
fn a_stalled_server_hits_the_deadline() {
    let (server, src) = serve(2, quick(2));
    server.inject([
        Fault::Stall(Duration::from_secs(3)),
        Fault::Stall(Duration::from_secs(3)),
    ]);
    let t = Instant::now();
    let e = src.read(0).unwrap_err();
    let took = t.elapsed();
    assert!(
        matches!(&e, Error::Remote { attempts: 2, source, .. } if source.is_transient()),
        "{e}"
    );
    // Two 500 ms deadlines, not two 3 s stalls.
    assert!(took < Duration::from_millis(2500), "took {took:?}");
}

#[test]
fn http_urls_open_with_the_feature() {
    let server = LoopbackServer::start().unwrap();
    let (store, prefix) = store_for_url(&format!("{}/a/b", server.url()), &quick(1)).unwrap();
    assert_eq!(prefix.as_ref(), "a/b");
    server.put("a/b/x.bin", vec![9; 5]);
    let src =
        ObjectStoreSource::from_keys(store, prefix.as_ref(), [("x.bin", None)], quick(1)).unwrap();
    assert_eq!(src.read(0).unwrap(), vec![9; 5]);
}

#[test]
fn an_http_data_set_through_the_cache_survives_a_flaky_server() {
    let t = tempfile::tempdir().unwrap();
    let (server, src) = serve(20, quick(3));
    let src = Arc::new(src);
    let cache = DataCache::builder_arc(src.clone(), Arc::new(U8Decoder::new(vec![1000])))
        .disk(t.path(), 1 << 20)
        .memory(1 << 20)
        .build()
        .unwrap();
    server.inject([Fault::Status(503), Fault::ShortBody]);
    for i in 0..20 {
        assert_eq!(cache.get_raw(i).unwrap(), body(i));
    }
    assert_eq!(cache.stats().source_reads, 20);
    // Now the server is gone: the disk level still serves every sample.
    drop(server);
    let again = DataCache::builder_arc(src, Arc::new(U8Decoder::new(vec![1000])))
        .disk(t.path(), 1 << 20)
        .build()
        .unwrap();
    for i in 0..20 {
        assert_eq!(again.get_raw(i).unwrap(), body(i));
    }
    assert_eq!(again.stats().source_reads, 0);
}

#[test]
fn bench_runs_small() {
    let cfg = BenchConfig {
        samples: 40,
        image_side: 16,
        batch_size: 8,
        workers: 2,
        prefetch_depth: 2,
        compute_per_batch_s: 1e-3,
        latency_probes: 10,
        ..BenchConfig::default()
    };
    let r = bench_support::run(&cfg).unwrap();
    assert_eq!(r.phases.len(), 8);
    assert!(r.phases.iter().all(|p| p.samples == 40));
    let e2 = r.phase("epoch2").unwrap();
    assert_eq!((e2.stats.memory_hits, e2.stats.source_reads), (40, 0));
    let rerun = r.phase("rerun_disk").unwrap();
    assert_eq!((rerun.stats.disk_hits, rerun.stats.source_reads), (40, 0));
    let remote = r.phase("remote").unwrap();
    assert_eq!(remote.stats.source_reads, 40);
    assert!(r.io_reduction.is_finite() && r.io_reduction > 0.0);
    assert!(r.table().contains("Fig. 9"));
}
