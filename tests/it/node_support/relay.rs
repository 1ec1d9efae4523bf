//! A TCP relay between the node and a real edge that the test can cut, as a network would:
//! both sides see their connection end, and the node's next dial goes through again.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::{AbortHandle, JoinHandle};

/// The relay; dropping it stops it.
pub struct Relay {
    /// Where the node dials.
    pub addr: SocketAddr,
    pipes: Arc<Mutex<Vec<AbortHandle>>>,
    accepting: JoinHandle<()>,
}

impl Relay {
    /// Relays every connection to `target`.
    pub async fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the relay");
        let addr = listener.local_addr().expect("relay addr");
        let pipes: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let kept = Arc::clone(&pipes);
        let accepting = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let pipe = tokio::spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                kept.lock().expect("pipes").push(pipe.abort_handle());
            }
        });
        Self {
            addr,
            pipes,
            accepting,
        }
    }

    /// Cuts every relayed connection.
    pub fn cut(&self) {
        for pipe in self.pipes.lock().expect("pipes").drain(..) {
            pipe.abort();
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.cut();
        self.accepting.abort();
    }
}
