//! What the edge talks to beyond its nodes, for the scenarios that measure it: a
//! `nats-server` child on a free loopback port (the `nats` sink), and an OTLP/HTTP
//! receiver that answers every export and discards it (`--otlp`), so span export costs
//! what it would against a collector on the same host. Both stop with the load generator.

use std::io::{BufRead, BufReader, Read, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// A `nats-server` started by this program, killed on drop.
pub struct NatsChild {
    child: Child,
    pub url: String,
    _store: tempfile::TempDir,
}

impl NatsChild {
    /// Starts `nats-server` (from `PATH`) on a free loopback port, with JetStream storing
    /// in a temporary directory when `jetstream`, and waits until it greets clients.
    pub fn start(jetstream: bool) -> anyhow::Result<Self> {
        let store = tempfile::tempdir().context("cannot make a temporary directory")?;
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let mut command = Command::new("nats-server");
        command.args(["-a", "127.0.0.1", "-p", &port.to_string()]);
        if jetstream {
            command.arg("-js").arg("-sd").arg(store.path());
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("cannot start nats-server (bash .ci/engines/nats-server.sh installs it)")?;
        let server = Self {
            child,
            url: format!("nats://127.0.0.1:{port}"),
            _store: store,
        };
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(10) {
            if greets(addr) {
                return Ok(server);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        bail!("nats-server did not greet clients within 10 s")
    }

    /// CPU time the server used so far, in ms.
    pub fn cpu_ms(&self) -> u64 {
        crate::harness::process_cpu_ms(self.child.id())
    }
}

impl Drop for NatsChild {
    fn drop(&mut self) {
        // Only the child this struct started.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether a NATS server at `addr` sends its `INFO` greeting.
fn greets(addr: SocketAddr) -> bool {
    let Ok(stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).is_ok() && line.starts_with("INFO ")
}

/// The discarding OTLP receiver, started on first use; its endpoint.
pub fn otlp_endpoint() -> &'static str {
    static RECEIVER: OnceLock<String> = OnceLock::new();
    RECEIVER.get_or_init(|| {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port for OTLP");
        let addr = listener.local_addr().expect("its address");
        std::thread::Builder::new()
            .name("otlp-receiver".into())
            .spawn(move || {
                for stream in listener.incoming().flatten() {
                    std::thread::spawn(move || answer_exports(stream));
                }
            })
            .expect("the OTLP receiver thread");
        format!("http://{addr}")
    })
}

/// Exports (requests) and bytes the receiver was sent.
pub static OTLP_EXPORTS: AtomicU64 = AtomicU64::new(0);
pub static OTLP_BYTES: AtomicU64 = AtomicU64::new(0);

/// Reads HTTP/1.1 requests on one connection and answers each `200` with an empty body.
fn answer_exports(stream: TcpStream) {
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    loop {
        let mut length = 0usize;
        let mut line = String::new();
        loop {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            if line == "\r\n" {
                break;
            }
            if let Some((name, value)) = line.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        OTLP_EXPORTS.fetch_add(1, Ordering::Relaxed);
        OTLP_BYTES.fetch_add(length as u64, Ordering::Relaxed);
        let answer = "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\n\
                      content-length: 0\r\n\r\n";
        if writer.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}
