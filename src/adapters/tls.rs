//! TLS for the edge's listeners (the node transport and the HTTP server): the
//! `[server.tls]` / `[http.tls]` settings and a server-side handshake bounded by a timeout.
//! Loading certificates and keys from PEM files is `wire::tls`, which the node client
//! shares.
//!
//! Everything uses rustls with the `ring` crypto provider, passed explicitly, so nothing
//! depends on a process-wide default provider and nothing needs a C toolchain beyond `cc`.
//! Files are read once, when the application builds its listeners; a file that is missing or
//! holds no usable PEM is an error naming the file and the setting it came from. This module
//! owns no socket and spawns no task: the listeners decide where a handshake runs.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rustls::server::WebPkiClientVerifier;
use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::server::TlsStream;

use crate::wire::tls::{
    TlsError, crypto_provider, load_certificates, load_private_key, load_roots,
};

/// `[server.tls]` or `[http.tls]`: the listener's certificate and key, and optionally the CA
/// that client certificates must be signed by (mutual TLS).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM file with the certificate chain the listener presents, leaf first.
    pub cert_path: PathBuf,
    /// PEM file with the private key of the leaf certificate (PKCS#8, PKCS#1 or SEC1).
    pub key_path: PathBuf,
    /// PEM file with the CA certificates that client certificates must chain to. When set,
    /// every client must present such a certificate (mutual TLS); when absent, none is asked.
    #[serde(default)]
    pub client_ca_path: Option<PathBuf>,
    /// How long a new connection has to complete the TLS handshake before it is closed.
    #[serde(default = "default_handshake_timeout_ms")]
    pub handshake_timeout_ms: u64,
}

fn default_handshake_timeout_ms() -> u64 {
    5_000
}

impl TlsConfig {
    /// `handshake_timeout_ms` as a duration.
    pub fn handshake_timeout(&self) -> Duration {
        Duration::from_millis(self.handshake_timeout_ms)
    }
}

/// Why a server-side handshake did not complete.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// The peer did not complete the handshake in time (it may never have started it).
    #[error("no TLS handshake within {0:?}")]
    Timeout(Duration),
    /// The handshake failed: not TLS, no or an untrusted client certificate, a socket error.
    #[error("TLS handshake failed: {0}")]
    Failed(#[source] io::Error),
}

/// Runs server-side TLS handshakes with one loaded configuration, each bounded by the
/// configured timeout. Cheap to clone.
#[derive(Clone)]
pub struct TlsAcceptor {
    inner: tokio_rustls::TlsAcceptor,
    handshake_timeout: Duration,
    mutual: bool,
}

impl std::fmt::Debug for TlsAcceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsAcceptor")
            .field("handshake_timeout", &self.handshake_timeout)
            .field("mutual", &self.mutual)
            .finish_non_exhaustive()
    }
}

impl TlsAcceptor {
    /// Loads the files `config` names. `section` is the config section the settings came
    /// from (`server.tls`, `http.tls`), for error messages; `alpn` lists the application
    /// protocols to offer, most preferred first (empty for none).
    ///
    /// # Errors
    /// [`TlsError`] naming the file and key when a file cannot be read, holds no usable PEM,
    /// or the certificate and key do not belong together.
    pub fn from_config(
        config: &TlsConfig,
        section: &str,
        alpn: &[&[u8]],
    ) -> Result<Self, TlsError> {
        let cert_setting = format!("`{section}.cert_path`");
        let key_setting = format!("`{section}.key_path`");
        let certificates = load_certificates(&config.cert_path, &cert_setting)?;
        let key = load_private_key(&config.key_path, &key_setting)?;
        let provider = crypto_provider();
        let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|error| TlsError::Internal(error.to_string()))?;
        let builder = match &config.client_ca_path {
            None => builder.with_no_client_auth(),
            Some(path) => {
                let setting = format!("`{section}.client_ca_path`");
                let roots = load_roots(path, &setting)?;
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                        .build()
                        .map_err(|error| TlsError::Ca {
                            setting,
                            path: path.clone(),
                            detail: error.to_string(),
                        })?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut server = builder
            .with_single_cert(certificates, key)
            .map_err(|error| TlsError::Identity {
                cert_setting,
                cert_path: config.cert_path.clone(),
                key_setting,
                key_path: config.key_path.clone(),
                detail: error.to_string(),
            })?;
        server.alpn_protocols = alpn.iter().map(|protocol| protocol.to_vec()).collect();
        Ok(Self {
            inner: tokio_rustls::TlsAcceptor::from(Arc::new(server)),
            handshake_timeout: config.handshake_timeout(),
            mutual: config.client_ca_path.is_some(),
        })
    }

    /// Whether clients must present a certificate signed by the configured CA.
    pub fn is_mutual(&self) -> bool {
        self.mutual
    }

    /// Runs the server side of the handshake over `stream`, giving up after the configured
    /// timeout. With mutual TLS, a client without a trusted certificate fails here.
    ///
    /// # Errors
    /// [`HandshakeError::Timeout`] when the peer was too slow, [`HandshakeError::Failed`]
    /// when the handshake failed.
    pub async fn accept<S>(&self, stream: S) -> Result<TlsStream<S>, HandshakeError>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        match tokio::time::timeout(self.handshake_timeout, self.inner.accept(stream)).await {
            Err(_elapsed) => Err(HandshakeError::Timeout(self.handshake_timeout)),
            Ok(Err(error)) => Err(HandshakeError::Failed(error)),
            Ok(Ok(stream)) => Ok(stream),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::path::Path;

    use super::*;

    fn file(contents: &[u8]) -> tempfile::NamedTempFile {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        file.write_all(contents).unwrap();
        file
    }

    fn config(cert: &Path, key: &Path) -> TlsConfig {
        TlsConfig {
            cert_path: cert.to_owned(),
            key_path: key.to_owned(),
            client_ca_path: None,
            handshake_timeout_ms: 5_000,
        }
    }

    #[test]
    fn a_missing_certificate_file_is_named_with_its_setting() {
        let key = file(b"");
        let missing = Path::new("/nonexistent/edge-cert.pem");
        let error =
            TlsAcceptor::from_config(&config(missing, key.path()), "server.tls", &[]).unwrap_err();
        let message = error.to_string();
        assert!(message.contains("`server.tls.cert_path`"), "{message}");
        assert!(message.contains("/nonexistent/edge-cert.pem"), "{message}");
    }

    #[test]
    fn garbage_instead_of_pem_is_named_with_its_setting() {
        let garbage = file(b"this is not a certificate\n");
        let error =
            TlsAcceptor::from_config(&config(garbage.path(), garbage.path()), "http.tls", &[])
                .unwrap_err();
        let message = error.to_string();
        assert!(matches!(error, TlsError::Pem { .. }), "{message}");
        assert!(message.contains("`http.tls.cert_path`"), "{message}");
        assert!(
            message.contains(&garbage.path().display().to_string()),
            "{message}"
        );
    }

    #[test]
    fn the_handshake_timeout_defaults_to_five_seconds() {
        #[derive(Deserialize)]
        struct Wrapper {
            tls: TlsConfig,
        }
        let wrapper: Wrapper =
            serde_json::from_str(r#"{"tls": {"cert_path": "c.pem", "key_path": "k.pem"}}"#)
                .unwrap();
        assert_eq!(wrapper.tls.handshake_timeout(), Duration::from_secs(5));
        assert_eq!(wrapper.tls.client_ca_path, None);
    }
}
