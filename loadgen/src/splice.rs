//! A TCP splice: a listener on loopback whose every connection is joined, byte for byte
//! both ways, to a connection to one address, on a one-worker runtime of its own — a hop
//! that does nothing but forward. Two of them in a row are `latency --floor-hops`, the floor
//! of the edge and node's two hops (issue 67).

use std::net::SocketAddr;

use anyhow::Context;
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Runtime;

use crate::harness::runtime;

/// A running splice; stops when dropped.
pub struct Splice {
    /// Where it listens.
    pub addr: SocketAddr,
    runtime: Option<Runtime>,
}

impl Splice {
    /// A splice named `name` (its runtime's thread) forwarding to `to`.
    pub fn start(name: &str, to: SocketAddr) -> anyhow::Result<Self> {
        let runtime = runtime(name, 1)?;
        let listener = runtime
            .block_on(TcpListener::bind("127.0.0.1:0"))
            .context("cannot bind a splice")?;
        let addr = listener.local_addr()?;
        runtime.spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(forward(client, to));
            }
        });
        Ok(Self {
            addr,
            runtime: Some(runtime),
        })
    }
}

impl Drop for Splice {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Joins `client` to a new connection to `to` until either side closes.
async fn forward(mut client: TcpStream, to: SocketAddr) {
    let Ok(mut upstream) = TcpStream::connect(to).await else {
        return;
    };
    // Small writes go out at once, as the edge's and the node's do.
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
}
