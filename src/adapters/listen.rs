//! Listening sockets with a configured accept backlog (`server.listen_backlog`,
//! `http.listen_backlog`), and the kernel's cap on that backlog. Binds only: accepting is
//! each listener's own business.

use std::io;
use std::net::SocketAddr;

use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::TcpListener;

/// Where Linux keeps the largest backlog `listen(2)` grants; larger requests are cut to it.
const SOMAXCONN: &str = "/proc/sys/net/core/somaxconn";

/// Binds `addr` and listens with room for `backlog` connections that finished the TCP
/// handshake but are not yet accepted (the kernel cuts it to its own cap, see
/// [`kernel_backlog_cap`]). Like tokio's own `bind`, the address is reusable at once after
/// a restart (`SO_REUSEADDR`, not on Windows).
///
/// # Errors
/// The socket error when the socket cannot be made, bound or put into listening.
pub fn bind(addr: SocketAddr, backlog: u32) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    #[cfg(not(windows))]
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(i32::try_from(backlog).unwrap_or(i32::MAX))?;
    TcpListener::from_std(socket.into())
}

/// The kernel's cap on listen backlogs (`net.core.somaxconn`), where the system tells it
/// (Linux); `None` elsewhere or when it cannot be read.
pub fn kernel_backlog_cap() -> Option<u32> {
    std::fs::read_to_string(SOMAXCONN).ok()?.trim().parse().ok()
}

/// The backlog a listener actually gets when `requested` meets the kernel's `cap`: `Some`
/// only when the cap cuts it.
pub fn capped_backlog(requested: u32, cap: Option<u32>) -> Option<u32> {
    cap.filter(|&cap| cap < requested)
}

/// Logs a warning, naming the config key and both values, when the kernel will cut the
/// backlog `key` asks for.
pub fn warn_if_capped(key: &str, requested: u32) {
    if let Some(granted) = capped_backlog(requested, kernel_backlog_cap()) {
        tracing::warn!(
            key,
            requested,
            somaxconn = granted,
            "`{key}` = {requested} is capped by the kernel to net.core.somaxconn = {granted}; \
             raise the sysctl for the full backlog"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_smaller_kernel_cap_cuts_the_backlog() {
        assert_eq!(capped_backlog(4096, Some(128)), Some(128));
        assert_eq!(capped_backlog(4096, Some(4096)), None);
        assert_eq!(capped_backlog(4096, Some(65_535)), None);
        assert_eq!(capped_backlog(4096, None), None);
    }

    #[tokio::test]
    async fn a_bound_listener_accepts_and_its_port_is_reusable_at_once() {
        let listener = bind(SocketAddr::from(([127, 0, 0, 1], 0)), 16).expect("bind");
        let addr = listener.local_addr().expect("addr");
        let client = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let (server, _) = listener.accept().await.expect("accept");
        drop(listener);
        // An accepted connection still open on the port: rebinding needs SO_REUSEADDR.
        let again = bind(addr, 16).expect("rebind while a connection lingers");
        assert_eq!(again.local_addr().expect("addr"), addr);
        drop((client, server));
    }
}
