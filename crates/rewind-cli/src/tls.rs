//! Certificates from PEM files into rustls configurations: the server's
//! (NBD TLS and HTTPS share one certificate) and the CLI's trust in a
//! server's CA.

use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};

/// ring: the provider ureq brings too, so there is one in the binary.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

pub fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let certificates = CertificateDer::pem_file_iter(path)
        .and_then(|certificates| certificates.collect::<Result<Vec<_>, _>>())
        .with_context(|| format!("cannot read certificates (PEM) from {}", path.display()))?;
    if certificates.is_empty() {
        bail!("{} holds no certificate (expected PEM: -----BEGIN CERTIFICATE-----)", path.display());
    }
    Ok(certificates)
}

fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_file(path)
        .with_context(|| format!("cannot read a private key (PEM: PKCS#8, PKCS#1 or SEC1) from {}", path.display()))
}

/// The server's TLS configurations: for NBD (asking for client
/// certificates signed by `client_ca`, if given) and for HTTPS (never
/// asking: the API has its tokens).
pub struct ServerTls {
    pub nbd: Arc<ServerConfig>,
    pub http: Arc<ServerConfig>,
}

pub fn server(cert: &Path, key: &Path, client_ca: Option<&Path>) -> Result<ServerTls> {
    let chain = certificates(cert)?;
    let key = private_key(key)?;
    let builder = || {
        ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions")
    };
    let nbd = match client_ca {
        None => builder().with_no_client_auth(),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for certificate in certificates(ca)? {
                roots.add(certificate).with_context(|| format!("{} is not a usable CA certificate", ca.display()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                .build()
                .with_context(|| format!("cannot verify clients with {}", ca.display()))?;
            builder().with_client_cert_verifier(verifier)
        }
    }
    .with_single_cert(chain.clone(), key.clone_key())
    .with_context(|| format!("the key does not fit the certificate in {}", cert.display()))?;
    let mut http = builder()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .with_context(|| format!("the key does not fit the certificate in {}", cert.display()))?;
    http.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(ServerTls { nbd: Arc::new(nbd), http: Arc::new(http) })
}
