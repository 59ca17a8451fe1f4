//! TLS material for tests of the credential sealer over HTTPS: a test CA and
//! a certificate it issued for `localhost` and `127.0.0.1`, valid until 2126
//! (`testkit/fixtures/`, made once with `openssl`; test-only, never deployed).

/// The sealer's certificate (PEM), for `SEALER_TLS_CERT`.
pub const CERT: &str = include_str!("../fixtures/sealer.pem");

/// Its private key (PEM, PKCS#8), for `SEALER_TLS_KEY`.
pub const KEY: &str = include_str!("../fixtures/sealer.key");

/// The CA that issued it (PEM), for `CREDENTIALS_SEALER_CA`.
pub const CA: &str = include_str!("../fixtures/sealer-ca.pem");
