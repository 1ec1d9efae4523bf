//! SMG 1.13 (`pip install smg==1.13.*`), the router the scenarios `latency` and `sessions`
//! measure the edge against, as a child process on free loopback ports.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use anyhow::Context;

use crate::engine::wait_healthy;

/// `smg launch` as a child, killed on drop.
pub struct Smg {
    child: Child,
    pub addr: SocketAddr,
}

impl Smg {
    /// Starts `program launch` with `args` (its workers and policy) on a free loopback
    /// port, its metrics on another, logging warnings only, and waits until it is healthy.
    pub fn start(program: &Path, args: &[&str]) -> anyhow::Result<Self> {
        let addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let metrics = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let child = Command::new(program)
            .args(["launch", "--host", "127.0.0.1"])
            .args(["--port", &addr.port().to_string()])
            .args(args)
            .args(["--prometheus-host", "127.0.0.1", "--prometheus-port"])
            .arg(metrics.port().to_string())
            .args(["--log-level", "warn"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("cannot start {}", program.display()))?;
        let mut smg = Self { child, addr };
        wait_healthy(addr, "/health", &mut smg.child)?;
        Ok(smg)
    }
}

impl Drop for Smg {
    fn drop(&mut self) {
        // Only the child this struct started.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
