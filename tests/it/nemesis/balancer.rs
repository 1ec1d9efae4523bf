//! The balancer clients reach the site through, as a site runs behind one: each new client
//! connection goes to the first member whose `/readyz` says 200 when it is accepted (closed
//! when none does). It can cut a client mid-stream: the connection goes silent both ways,
//! nothing closed, as when the client's network drops — the client's own silence timeout
//! finds it. (The clients live in the test process, in the root namespace: their cut is made
//! here rather than by a namespace's firewall.)

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// How long a cut connection stays open, silent, before it is dropped.
const SILENT_FOR: Duration = Duration::from_secs(20);

/// `GET /readyz` at `http` answers 200 within a second.
pub(crate) async fn ready(http: SocketAddr) -> bool {
    let client = crate::common::http_client();
    let answer = client
        .get(format!("http://{http}/readyz"))
        .timeout(Duration::from_secs(1))
        .send()
        .await;
    answer.is_ok_and(|a| a.status().is_success())
}

pub(crate) struct Balancer {
    pub(crate) addr: SocketAddr,
    /// The connections forwarded now, each with the token that cuts it.
    live: Arc<Mutex<Vec<CancellationToken>>>,
    accepting: tokio::task::JoinHandle<()>,
}

impl Balancer {
    /// A balancer on loopback in front of the members at `members` (their HTTP addresses).
    pub(crate) async fn start(members: Vec<SocketAddr>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let live = Arc::new(Mutex::new(Vec::<CancellationToken>::new()));
        let tracked = Arc::clone(&live);
        let accepting = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let cut = CancellationToken::new();
                {
                    let mut live = tracked.lock().expect("live");
                    live.retain(|c| !c.is_cancelled());
                    live.push(cut.clone());
                }
                tokio::spawn(forward(client, members.clone(), cut));
            }
        });
        Self {
            addr,
            live,
            accepting,
        }
    }

    /// Cuts the `pick`th live connection (modulo how many there are); whether there was one.
    pub(crate) fn cut(&self, pick: usize) -> bool {
        let live = self.live.lock().expect("live");
        if live.is_empty() {
            return false;
        }
        live[pick % live.len()].cancel();
        true
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

/// Sends `client` to the first of `members` that is ready, byte for byte until either side
/// closes or `cut` is cancelled (then both sides hear nothing more, for a while).
async fn forward(client: TcpStream, members: Vec<SocketAddr>, cut: CancellationToken) {
    for member in members {
        if !ready(member).await {
            continue;
        }
        let Ok(upstream) = TcpStream::connect(member).await else {
            return;
        };
        let (mut client_read, mut client_write) = client.into_split();
        let (mut upstream_read, mut upstream_write) = upstream.into_split();
        let up = pipe(&mut client_read, &mut upstream_write);
        let down = pipe(&mut upstream_read, &mut client_write);
        tokio::select! {
            _ = async { tokio::join!(up, down) } => {}
            () = cut.cancelled() => tokio::time::sleep(SILENT_FOR).await,
        }
        cut.cancel();
        return;
    }
    cut.cancel();
}

/// Copies `from` to `to` until `from` ends (then shuts `to`'s writing half).
async fn pipe(from: &mut (impl AsyncReadExt + Unpin), to: &mut (impl AsyncWriteExt + Unpin)) {
    let mut buffer = vec![0; 16 * 1024];
    while let Ok(n) = from.read(&mut buffer).await {
        if n == 0 || to.write_all(&buffer[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}
