//! The byte stream under a node's connection, plain TCP or TLS, and the TLS client
//! configuration. The frames inside are the same either way.

use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::wire::tls::{
    TlsError, crypto_provider, load_certificates, load_private_key, load_roots,
};

/// The byte stream under a [`NodeClient`](super::NodeClient): plain TCP, or TLS over TCP. Either way the
/// frames inside are the same.
#[derive(Debug)]
pub enum ClientStream {
    /// Plain TCP.
    Plain(TcpStream),
    /// TLS over TCP (boxed: a TLS session is much larger than a socket).
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl AsyncRead for ClientStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(stream) => Pin::new(stream).poll_read(cx, buf),
            Self::Tls(stream) => Pin::new(stream).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ClientStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(stream) => Pin::new(stream).poll_write(cx, buf),
            Self::Tls(stream) => Pin::new(stream).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(stream) => Pin::new(stream).poll_flush(cx),
            Self::Tls(stream) => Pin::new(stream).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(stream) => Pin::new(stream).poll_shutdown(cx),
            Self::Tls(stream) => Pin::new(stream).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(stream) => Pin::new(stream).poll_write_vectored(cx, bufs),
            Self::Tls(stream) => Pin::new(stream).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Self::Plain(stream) => stream.is_write_vectored(),
            Self::Tls(stream) => stream.is_write_vectored(),
        }
    }
}

/// A TLS client configuration for [`NodeClient::connect_tls`](super::NodeClient::connect_tls): trusts the CA certificates in
/// the PEM file `ca_path`, and presents the certificate chain and key in `identity` (PEM
/// files: certificate, key) when the edge requires mutual TLS.
///
/// # Errors
/// [`TlsError`] naming the file when one cannot be read, holds no usable PEM, or the
/// certificate and key do not belong together.
pub fn tls_client_config(
    ca_path: &Path,
    identity: Option<(&Path, &Path)>,
) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let roots = load_roots(ca_path, "CA certificate")?;
    let builder = rustls::ClientConfig::builder_with_provider(crypto_provider())
        .with_safe_default_protocol_versions()
        .map_err(|error| TlsError::Internal(error.to_string()))?
        .with_root_certificates(roots);
    let config = match identity {
        None => builder.with_no_client_auth(),
        Some((cert_path, key_path)) => {
            let certificates = load_certificates(cert_path, "client certificate")?;
            let key = load_private_key(key_path, "client key")?;
            builder
                .with_client_auth_cert(certificates, key)
                .map_err(|error| TlsError::Identity {
                    cert_setting: "client certificate".to_owned(),
                    cert_path: cert_path.to_owned(),
                    key_setting: "client key".to_owned(),
                    key_path: key_path.to_owned(),
                    detail: error.to_string(),
                })?
        }
    };
    Ok(Arc::new(config))
}
