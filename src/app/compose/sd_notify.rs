//! systemd's readiness protocol (`sd_notify(3)`), for `Type=notify` units: `READY=1` once the
//! edge's listeners are bound, `STOPPING=1` when a graceful stop begins. Each is one datagram
//! to the Unix socket `$NOTIFY_SOCKET` names — a file system path, or an abstract socket's
//! name written with a leading `@`.
//!
//! Standard library only (no crate for one `sendto`). Without `$NOTIFY_SOCKET` (not started
//! by systemd, or a unit of another `Type=`) it does nothing; a notice that cannot be sent
//! is logged, never an error: the edge serves the same either way.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

/// The variable systemd sets for a `Type=notify` service.
const NOTIFY_SOCKET: &str = "NOTIFY_SOCKET";

/// The listeners are bound: the service has started.
pub(crate) const READY: &str = "READY=1";

/// A graceful stop has begun.
pub(crate) const STOPPING: &str = "STOPPING=1";

/// Sends `state` to `$NOTIFY_SOCKET`, if it is set; logs a warning when it cannot.
pub(crate) fn notify(state: &str) {
    let Some(socket) = std::env::var_os(NOTIFY_SOCKET).filter(|s| !s.is_empty()) else {
        return;
    };
    match send(&socket, state) {
        Ok(()) => tracing::debug!(state, "told systemd"),
        Err(error) => tracing::warn!(
            %error,
            socket = %socket.to_string_lossy(),
            state,
            "cannot tell systemd (NOTIFY_SOCKET)"
        ),
    }
}

/// Sends `state` as one datagram to `socket`: a path, or `@` and an abstract socket's name.
///
/// # Errors
/// `socket` is neither, or the datagram cannot be sent whole.
pub(crate) fn send(socket: &OsStr, state: &str) -> io::Result<()> {
    let address = address(socket)?;
    let sent = UnixDatagram::unbound()?.send_to_addr(state.as_bytes(), &address)?;
    if sent == state.len() {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::WriteZero,
            format!("sent {sent} of {} bytes", state.len()),
        ))
    }
}

/// The socket address `$NOTIFY_SOCKET` names.
fn address(socket: &OsStr) -> io::Result<SocketAddr> {
    match socket.as_bytes().split_first() {
        Some((b'@', name)) => abstract_address(name),
        Some((b'/', _)) => SocketAddr::from_pathname(socket),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "neither an absolute path nor an @abstract name",
        )),
    }
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn abstract_address(name: &[u8]) -> io::Result<SocketAddr> {
    use std::os::linux::net::SocketAddrExt;
    SocketAddr::from_abstract_name(name)
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn abstract_address(_name: &[u8]) -> io::Result<SocketAddr> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "abstract sockets are Linux's",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn received(socket: &UnixDatagram) -> String {
        socket
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut buffer = [0_u8; 64];
        let n = socket.recv(&mut buffer).unwrap();
        String::from_utf8_lossy(&buffer[..n]).into_owned()
    }

    #[test]
    fn a_notice_reaches_a_socket_named_by_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let listener = UnixDatagram::bind(&path).unwrap();
        send(path.as_os_str(), READY).unwrap();
        assert_eq!(received(&listener), "READY=1");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_notice_reaches_an_abstract_socket_named_with_an_at() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("edge-sd-notify-test-{}", std::process::id());
        let listener =
            UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes()).unwrap())
                .unwrap();
        send(OsStr::new(&format!("@{name}")), STOPPING).unwrap();
        assert_eq!(received(&listener), "STOPPING=1");
    }

    #[test]
    fn a_relative_path_or_a_socket_nobody_listens_on_is_an_error() {
        assert!(send(OsStr::new("notify"), READY).is_err());
        let dir = tempfile::tempdir().unwrap();
        assert!(send(dir.path().join("nobody").as_os_str(), READY).is_err());
    }
}
