//! TLS between broker workers and the credential sealer: the sealer's
//! certificate chain and key (`SEALER_TLS_CERT`, `SEALER_TLS_KEY`, PEM, as
//! ECS hands secrets over: in the environment) and the CA a worker trusts for
//! it (`CREDENTIALS_SEALER_CA`). rustls with the aws-lc-rs provider, as
//! everywhere else in the workspace. The answer is sealed to the worker's key
//! either way; TLS keeps the request (user, worker, key) and any future
//! caller proof off the wire and lets a worker know it talks to the sealer.

use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Why TLS material cannot be used (never quotes the material).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TlsError {
    /// No certificate in the PEM text.
    #[error("holds no PEM certificate")]
    NoCertificate,
    /// A certificate or key that does not parse.
    #[error("is not valid PEM ({0})")]
    BadPem(String),
    /// rustls refused the configuration (e.g. the key does not match).
    #[error("is refused by rustls: {0}")]
    Refused(String),
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

fn certificates(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let chain = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|err| TlsError::BadPem(err.to_string()))?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate);
    }
    Ok(chain)
}

/// The sealer's server configuration from its PEM chain and key (HTTP/1.1).
pub fn server_config(chain_pem: &[u8], key_pem: &[u8]) -> Result<rustls::ServerConfig, TlsError> {
    let chain = certificates(chain_pem)?;
    let key = PrivateKeyDer::from_pem_slice(key_pem)
        // The parser's message names the PEM section, never key bytes.
        .map_err(|err| TlsError::BadPem(err.to_string()))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|err| TlsError::Refused(err.to_string()))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|err| TlsError::Refused(err.to_string()))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// A worker's client configuration trusting only the CA certificates in
/// `ca_pem` (`None`: trusts nothing, so only `http://` works).
pub fn client_config(ca_pem: Option<&[u8]>) -> Result<rustls::ClientConfig, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    if let Some(pem) = ca_pem {
        for certificate in certificates(pem)? {
            roots
                .add(certificate)
                .map_err(|err| TlsError::BadPem(err.to_string()))?;
        }
    }
    Ok(rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|err| TlsError::Refused(err.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// A client configuration trusting the public web PKI (Mozilla's roots, as
/// `webpki-roots` ships them): what the sealer calls STS with.
pub fn public_client_config() -> Result<rustls::ClientConfig, TlsError> {
    let roots = rustls::RootCertStore::from_iter(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    Ok(rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|err| TlsError::Refused(err.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CERT: &[u8] = leasehold_testkit::sealer_tls::CERT.as_bytes();
    const KEY: &[u8] = leasehold_testkit::sealer_tls::KEY.as_bytes();
    const CA: &[u8] = leasehold_testkit::sealer_tls::CA.as_bytes();

    #[test]
    fn material_is_checked_and_never_quoted() {
        assert!(server_config(CERT, KEY).is_ok());
        assert!(client_config(Some(CA)).is_ok());
        assert_eq!(
            server_config(b"", KEY).unwrap_err(),
            TlsError::NoCertificate
        );
        let err = server_config(
            CERT,
            b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
        )
        .unwrap_err();
        assert!(!err.to_string().contains("AAAA"), "{err}");
        // A key that is not the certificate's.
        let other = b"-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgxv9kpvJsGv7/8KGk\ne7sU/25dr9JrL5NzHGb4hP+mOyWhRANCAASGu6IZyYth8QfkOsaBu2knNLG/J/wt\nYLQqYqzx6PNaOxvaLgh46H2kn0gsmXW4cPc7JqUa82gokHd4rIKidHEd\n-----END PRIVATE KEY-----\n";
        assert!(matches!(
            server_config(CERT, other),
            Err(TlsError::Refused(_))
        ));
    }
}
