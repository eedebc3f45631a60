//! A small HTTP/1.1 object server on loopback, standard library only, for benches and tests:
//! whole-object `GET` and `HEAD` with `Content-Length`, keep-alive, objects from a directory
//! or from memory, and injected faults (error statuses, stalls, bodies cut short) to exercise
//! the client's deadlines and retries against a real TCP connection.
//!
//! It is what `object_store`'s HTTP store talks to in the bench and the tests; it does not
//! implement listing (WebDAV `PROPFIND`), so data sets on it are opened from a manifest
//! ([`crate::ObjectStoreSource::from_keys`]).

use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// A failure the server plays instead of answering one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Answer with this status and an empty body.
    Status(u16),
    /// Say nothing for this long, then drop the connection.
    Stall(Duration),
    /// Announce the whole length, send half the body, drop the connection.
    ShortBody,
}

#[derive(Debug, Default)]
struct Shared {
    root: Option<PathBuf>,
    objects: Mutex<HashMap<String, Vec<u8>>>,
    faults: Mutex<VecDeque<Fault>>,
    requests: AtomicU64,
    stop: AtomicBool,
}

/// The server; it stops when dropped.
#[derive(Debug)]
pub struct LoopbackServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

/// Idle keep-alive connections are closed after this long.
const IDLE: Duration = Duration::from_secs(5);
/// Longest request head accepted.
const MAX_HEAD: usize = 16 << 10;

impl LoopbackServer {
    /// Serves objects put with [`LoopbackServer::put`].
    pub fn start() -> std::io::Result<Self> {
        Self::spawn(Shared::default())
    }

    /// Serves the files under `root`: the object `a/b.png` is the file `root/a/b.png`.
    pub fn serve_dir(root: impl Into<PathBuf>) -> std::io::Result<Self> {
        Self::spawn(Shared {
            root: Some(root.into()),
            ..Shared::default()
        })
    }

    fn spawn(shared: Shared) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(shared);
        let s = shared.clone();
        let accept = std::thread::Builder::new()
            .name("loopback-http".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if s.stop.load(Relaxed) {
                        break;
                    }
                    let Ok(conn) = conn else { continue };
                    let s = s.clone();
                    let _ = std::thread::Builder::new()
                        .name("loopback-http-conn".into())
                        .spawn(move || serve_connection(conn, &s));
                }
            })?;
        Ok(Self {
            addr,
            shared,
            accept: Some(accept),
        })
    }

    /// `http://127.0.0.1:PORT`, the base URL of the store.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Adds (or replaces) the in-memory object `key`.
    pub fn put(&self, key: &str, bytes: Vec<u8>) {
        lock(&self.shared.objects).insert(key.trim_start_matches('/').to_string(), bytes);
    }

    /// Queues faults, played in order on the next requests (one fault per request).
    pub fn inject(&self, faults: impl IntoIterator<Item = Fault>) {
        lock(&self.shared.faults).extend(faults);
    }

    /// Requests answered or failed so far.
    pub fn requests(&self) -> u64 {
        self.shared.requests.load(Relaxed)
    }
}

impl Drop for LoopbackServer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Relaxed);
        // Wake the accept loop so that it sees the flag.
        let _ = TcpStream::connect(self.addr);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// `%XX` escapes of a request path decoded (object_store escapes reserved characters).
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn serve_connection(conn: TcpStream, s: &Shared) {
    let _ = conn.set_read_timeout(Some(IDLE));
    let _ = conn.set_nodelay(true);
    let Ok(mut out) = conn.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(conn);
    loop {
        // Request line and headers; a body (none for GET/HEAD) is skipped by length.
        let mut head = Vec::new();
        loop {
            let mut line = Vec::new();
            match reader
                .by_ref()
                .take(MAX_HEAD as u64)
                .read_until(b'\n', &mut line)
            {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            if line == b"\r\n" || line == b"\n" {
                break;
            }
            head.push(String::from_utf8_lossy(&line).trim_end().to_string());
            if head.len() > 100 {
                return;
            }
        }
        if s.stop.load(Relaxed) {
            return;
        }
        s.requests.fetch_add(1, Relaxed);
        let mut words = head
            .first()
            .map(|l| l.split_whitespace())
            .into_iter()
            .flatten();
        let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or("/"));
        let header = |name: &str| {
            head.iter().skip(1).find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.trim()
                    .eq_ignore_ascii_case(name)
                    .then(|| v.trim().to_string())
            })
        };
        let close = header("connection").is_some_and(|v| v.eq_ignore_ascii_case("close"));
        let body_len: u64 = header("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        if std::io::copy(&mut reader.by_ref().take(body_len), &mut std::io::sink()).is_err() {
            return;
        }
        let key = percent_decode(
            target
                .split('?')
                .next()
                .unwrap_or("")
                .trim_start_matches('/'),
        );
        let fault = lock(&s.faults).pop_front();
        let keep = match fault {
            Some(Fault::Stall(d)) => {
                std::thread::sleep(d);
                false
            }
            Some(Fault::Status(code)) => respond(&mut out, code, method, &[], false).is_ok(),
            Some(Fault::ShortBody) => {
                if let Some(body) = lookup(s, &key) {
                    let _ = respond(&mut out, 200, method, &body, true);
                }
                false
            }
            None => {
                let found = (method == "GET" || method == "HEAD")
                    .then(|| lookup(s, &key))
                    .flatten();
                match (method, found) {
                    ("GET" | "HEAD", Some(body)) => {
                        respond(&mut out, 200, method, &body, false).is_ok()
                    }
                    ("GET" | "HEAD", None) => respond(&mut out, 404, method, &[], false).is_ok(),
                    _ => respond(&mut out, 405, method, &[], false).is_ok(),
                }
            }
        };
        if !keep || close {
            return;
        }
    }
}

fn lookup(s: &Shared, key: &str) -> Option<Vec<u8>> {
    if key.split('/').any(|p| p == ".." || p.starts_with('.')) {
        return None;
    }
    match &s.root {
        Some(root) => std::fs::read(root.join(key)).ok(),
        None => lock(&s.objects).get(key).cloned(),
    }
}

fn respond(
    out: &mut TcpStream,
    code: u16,
    method: &str,
    body: &[u8],
    cut_short: bool,
) -> std::io::Result<()> {
    let reason = match code {
        200 => "OK",
        404 => "Not Found",
        405 => "Method Not Allowed",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Status",
    };
    let head = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Length: {}\r\nContent-Type: application/octet-stream\r\n\
         Last-Modified: Thu, 01 Jan 2026 00:00:00 GMT\r\n\r\n",
        body.len()
    );
    out.write_all(head.as_bytes())?;
    if method != "HEAD" {
        let n = if cut_short {
            body.len() / 2
        } else {
            body.len()
        };
        out.write_all(&body[..n])?;
    }
    out.flush()
}
