//! A TCP relay between a node and a real edge that the test can break, as a network would:
//! [`Relay::cut`] closes the relayed connections (both sides see them end), and
//! [`Relay::black_hole`] stops forwarding in both directions without closing either socket
//! (a NAT entry that expired, a roaming Wi-Fi client: neither side is told). Either way the
//! node's next dial goes through again.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::{AbortHandle, JoinHandle};
use tokio_util::sync::CancellationToken;

/// One relayed connection.
struct Pipe {
    task: AbortHandle,
    /// Cancelled to stop forwarding while holding both sockets open.
    freeze: CancellationToken,
}

/// The relay; dropping it stops it.
pub struct Relay {
    /// Where the node dials.
    pub addr: SocketAddr,
    /// Connections forwarding now.
    pipes: Arc<Mutex<Vec<Pipe>>>,
    /// Connections black-holed: open, forwarding nothing, until the relay is dropped.
    frozen: Mutex<Vec<Pipe>>,
    accepting: JoinHandle<()>,
}

impl Relay {
    /// Relays every connection to `target`.
    pub async fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the relay");
        let addr = listener.local_addr().expect("relay addr");
        let pipes: Arc<Mutex<Vec<Pipe>>> = Arc::default();
        let kept = Arc::clone(&pipes);
        let accepting = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let freeze = CancellationToken::new();
                let task = tokio::spawn(forward(inbound, target, freeze.clone()));
                kept.lock().expect("pipes").push(Pipe {
                    task: task.abort_handle(),
                    freeze,
                });
            }
        });
        Self {
            addr,
            pipes,
            frozen: Mutex::default(),
            accepting,
        }
    }

    /// Cuts every relayed connection.
    pub fn cut(&self) {
        for pipe in self.pipes.lock().expect("pipes").drain(..) {
            pipe.task.abort();
        }
    }

    /// Stops forwarding on every relayed connection, both ways, without closing any
    /// socket; connections made afterwards are relayed as usual.
    pub fn black_hole(&self) {
        let mut frozen = self.frozen.lock().expect("frozen");
        for pipe in self.pipes.lock().expect("pipes").drain(..) {
            pipe.freeze.cancel();
            frozen.push(pipe);
        }
    }
}

/// Relays `inbound` to a new connection to `target` until either side closes, or, once
/// `freeze` is cancelled, holds both open forwarding nothing.
async fn forward(mut inbound: TcpStream, target: SocketAddr, freeze: CancellationToken) {
    let Ok(mut outbound) = TcpStream::connect(target).await else {
        return;
    };
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
        () = freeze.cancelled() => std::future::pending::<()>().await,
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.cut();
        for pipe in self.frozen.lock().expect("frozen").drain(..) {
            pipe.task.abort();
        }
        self.accepting.abort();
    }
}
