//! The TLS material both sides of the node protocol load: the crypto provider, certificates,
//! keys and CA roots from PEM files, the platform's trust store, and the one error type
//! naming the file and setting a failure came from. The edge's listeners build on it
//! (`adapters::tls`), and so does the node client (`client::ClientStream`), which is why it
//! lives here with the protocol rather than among the server's adapters.
//!
//! Everything uses rustls with the `ring` crypto provider, passed explicitly, so nothing
//! depends on a process-wide default provider. It reads files and owns no socket.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Why TLS could not be set up. Every message names the file and the setting it came from.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The file cannot be read.
    #[error("cannot read {setting} file {}: {source}", .path.display())]
    Read {
        /// The setting that names the file, such as `` `server.tls.cert_path` ``.
        setting: String,
        /// The file.
        path: PathBuf,
        /// What the operating system said.
        source: io::Error,
    },
    /// The file is not PEM, or holds no item of the kind expected.
    #[error("{setting} file {} holds no usable PEM {expected}: {detail}", .path.display())]
    Pem {
        /// The setting that names the file.
        setting: String,
        /// The file.
        path: PathBuf,
        /// What was looked for: `certificate` or `private key`.
        expected: &'static str,
        /// What the PEM parser said.
        detail: String,
    },
    /// A CA certificate cannot be used to verify clients or servers.
    #[error("{setting} file {} holds an unusable CA certificate: {detail}", .path.display())]
    Ca {
        /// The setting that names the file.
        setting: String,
        /// The file.
        path: PathBuf,
        /// What rustls said.
        detail: String,
    },
    /// The certificate and key were read but rustls refuses them together (a key that does
    /// not match the certificate, an unsupported key type).
    #[error(
        "{cert_setting} ({}) and {key_setting} ({}) cannot be used together: {detail}",
        .cert_path.display(),
        .key_path.display()
    )]
    Identity {
        /// The setting that names the certificate file.
        cert_setting: String,
        /// The certificate file.
        cert_path: PathBuf,
        /// The setting that names the key file.
        key_setting: String,
        /// The key file.
        key_path: PathBuf,
        /// What rustls said.
        detail: String,
    },
    /// rustls refused the configuration for another reason.
    #[error("cannot set up TLS: {0}")]
    Internal(String),
}

/// The crypto provider every TLS configuration of the crate uses: rustls' `ring` backend.
pub fn crypto_provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A client configuration that verifies servers against the platform's trust store (the
/// system's CA certificates), with the `ring` provider passed in rather than read from a
/// process default: for HTTPS clients of public endpoints (an OTLP collector, an engine
/// without a private CA).
///
/// # Errors
/// [`TlsError::Internal`] when the platform verifier cannot be set up.
pub fn platform_client_config() -> Result<rustls::ClientConfig, TlsError> {
    use rustls_platform_verifier::BuilderVerifierExt as _;
    let config = rustls::ClientConfig::builder_with_provider(crypto_provider())
        .with_safe_default_protocol_versions()
        .and_then(|builder| builder.with_platform_verifier())
        .map_err(|error| TlsError::Internal(error.to_string()))?
        .with_no_client_auth();
    Ok(config)
}

fn read(path: &Path, setting: &str) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        setting: setting.to_owned(),
        path: path.to_owned(),
        source,
    })
}

/// Every certificate in the PEM file at `path`, in order; `setting` names the file in errors.
///
/// # Errors
/// [`TlsError::Read`] when the file cannot be read, [`TlsError::Pem`] when it is not PEM or
/// holds no certificate.
pub fn load_certificates(
    path: &Path,
    setting: &str,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(path, setting)?;
    let pem_error = |detail: String| TlsError::Pem {
        setting: setting.to_owned(),
        path: path.to_owned(),
        expected: "certificate",
        detail,
    };
    let certificates = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| pem_error(error.to_string()))?;
    if certificates.is_empty() {
        return Err(pem_error("no `BEGIN CERTIFICATE` section found".to_owned()));
    }
    Ok(certificates)
}

/// The first private key in the PEM file at `path`; `setting` names the file in errors.
///
/// # Errors
/// [`TlsError::Read`] when the file cannot be read, [`TlsError::Pem`] when it is not PEM or
/// holds no private key.
pub fn load_private_key(path: &Path, setting: &str) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read(path, setting)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|error| TlsError::Pem {
        setting: setting.to_owned(),
        path: path.to_owned(),
        expected: "private key",
        // The parser's messages never quote key material.
        detail: match error {
            rustls::pki_types::pem::Error::NoItemsFound => {
                "no `BEGIN ... PRIVATE KEY` section found".to_owned()
            }
            other => other.to_string(),
        },
    })
}

/// The CA certificates in the PEM file at `path`, as trust anchors.
///
/// # Errors
/// As [`load_certificates`], and [`TlsError::Ca`] when a certificate cannot be a trust anchor.
pub fn load_roots(path: &Path, setting: &str) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for certificate in load_certificates(path, setting)? {
        roots.add(certificate).map_err(|error| TlsError::Ca {
            setting: setting.to_owned(),
            path: path.to_owned(),
            detail: error.to_string(),
        })?;
    }
    Ok(roots)
}
