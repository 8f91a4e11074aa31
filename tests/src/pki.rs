//! A certificate authority for tests: certificates for the services, for
//! clients and for a PostgreSQL server, written as PEM files.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, SanType,
};

/// A self-signed certificate authority.
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A certificate and its key, as files.
#[derive(Debug, Clone)]
pub struct Issued {
    /// The PEM certificate.
    pub cert: PathBuf,
    /// The PEM private key.
    pub key: PathBuf,
}

impl TestCa {
    /// A new authority named `name`.
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let key = KeyPair::generate().expect("a CA key");
        Self { issuer: CertifiedIssuer::self_signed(params, key).expect("a CA certificate") }
    }

    /// Writes the authority's certificate to `path`.
    pub fn write(&self, path: &Path) -> PathBuf {
        std::fs::write(path, self.issuer.pem()).expect("writing the CA");
        path.to_path_buf()
    }

    /// A certificate for `names` (DNS names, or IP addresses), good for
    /// servers and clients, written as `<prefix>.crt` and `<prefix>.key` in `folder`.
    pub fn issue(&self, folder: &Path, prefix: &str, names: &[&str]) -> Issued {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("parameters");
        params.subject_alt_names = names
            .iter()
            .map(|name| match name.parse() {
                Ok(address) => SanType::IpAddress(address),
                Err(_) => SanType::DnsName((*name).try_into().expect("a DNS name")),
            })
            .collect();
        params.distinguished_name.push(DnType::CommonName, names.first().copied().unwrap_or(prefix));
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        let key = KeyPair::generate().expect("a key");
        let certificate = params.signed_by(&key, &self.issuer).expect("a certificate");
        let issued = Issued { cert: folder.join(format!("{prefix}.crt")), key: folder.join(format!("{prefix}.key")) };
        std::fs::write(&issued.cert, certificate.pem()).expect("writing a certificate");
        std::fs::write(&issued.key, key.serialize_pem()).expect("writing a key");
        issued
    }
}
