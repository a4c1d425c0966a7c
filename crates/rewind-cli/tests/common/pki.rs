//! Test certificates: a CA, a server certificate for 127.0.0.1 and
//! localhost, and client certificates, written as the files `rewind serve`,
//! libnbd (`tls-certificates=DIR`) and qemu (`tls-creds-x509,dir=DIR`) read.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};

pub struct Pki {
    dir: PathBuf,
    ca: CertifiedIssuer<'static, KeyPair>,
}

impl Pki {
    /// A new CA named `name`, its certificate in `dir/ca-cert.pem`.
    pub fn new(dir: &Path, name: &str) -> Pki {
        std::fs::create_dir_all(dir).unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        std::fs::write(dir.join("ca-cert.pem"), ca.pem()).unwrap();
        Pki { dir: dir.to_owned(), ca }
    }

    pub fn ca_cert(&self) -> PathBuf {
        self.dir.join("ca-cert.pem")
    }

    /// `server-cert.pem` and `server-key.pem` for 127.0.0.1 and localhost.
    pub fn server(&self) -> (PathBuf, PathBuf) {
        let mut params = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, "localhost");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        let key = KeyPair::generate().unwrap();
        let certificate = params.signed_by(&key, &self.ca).unwrap();
        let (cert_path, key_path) = (self.dir.join("server-cert.pem"), self.dir.join("server-key.pem"));
        std::fs::write(&cert_path, certificate.pem()).unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        (cert_path, key_path)
    }

    /// A directory for one client (common name `name`): `ca-cert.pem`,
    /// `client-cert.pem`, `client-key.pem`, the layout libnbd and qemu read.
    /// `trusted_ca` is the CA the client trusts for the server.
    pub fn client(&self, name: &str, trusted_ca: &Path) -> PathBuf {
        let dir = self.dir.join(format!("client-{name}"));
        std::fs::create_dir_all(&dir).unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.distinguished_name.push(DnType::OrganizationName, "Rewind tests");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        let key = KeyPair::generate().unwrap();
        let certificate = params.signed_by(&key, &self.ca).unwrap();
        std::fs::copy(trusted_ca, dir.join("ca-cert.pem")).unwrap();
        std::fs::write(dir.join("client-cert.pem"), certificate.pem()).unwrap();
        std::fs::write(dir.join("client-key.pem"), key.serialize_pem()).unwrap();
        dir
    }
}
