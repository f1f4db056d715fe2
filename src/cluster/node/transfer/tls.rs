//! The transfer channel's TLS: each node plugin makes a self-signed certificate at start and says
//! its SHA-256 in its advert (`advert`), which only that node may write; a node that pulls trusts
//! exactly that certificate. So the data is encrypted on the wire, and the puller knows it talks
//! to the node plugin of the source's node: no CA, nothing to rotate, nothing on disk (a restart
//! makes a new pair and writes a new advert). TLS 1.3 only, ring as kube's client uses.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, ServerConfig, SignatureScheme};
use sha2::{Digest, Sha256};

/// The name the certificate carries and the puller asks for (the pin is what is checked).
pub const SERVER_NAME: &str = "stickyvol-transfer";

/// This node plugin's certificate and key, made at start.
pub struct Identity {
    cert: CertificateDer<'static>,
    key: PrivatePkcs8KeyDer<'static>,
    /// The certificate's SHA-256, hex: what the advert says.
    pub fingerprint: String,
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// SHA-256 of a certificate, lower-case hex.
pub fn fingerprint(cert: &[u8]) -> String {
    Sha256::digest(cert)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl Identity {
    /// A new self-signed ECDSA P-256 certificate for `SERVER_NAME`.
    pub fn generate() -> Result<Identity, String> {
        let made = rcgen::generate_simple_self_signed(vec![SERVER_NAME.to_string()])
            .map_err(|err| format!("making the transfer certificate: {err}"))?;
        let cert = made.cert.der().clone();
        let key = PrivatePkcs8KeyDer::from(made.key_pair.serialize_der());
        let fingerprint = fingerprint(cert.as_ref());
        Ok(Identity {
            cert,
            key,
            fingerprint,
        })
    }

    /// What the source side serves with: this certificate, TLS 1.3, no client certificate (the
    /// puller proves who it is with its token, inside the channel).
    pub fn server_config(&self) -> Result<Arc<ServerConfig>, String> {
        let key = PrivateKeyDer::Pkcs8(self.key.clone_key());
        ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .and_then(|builder| {
                builder
                    .with_no_client_auth()
                    .with_single_cert(vec![self.cert.clone()], key)
            })
            .map(Arc::new)
            .map_err(|err| format!("the transfer server's TLS: {err}"))
    }
}

/// What a puller connects with: TLS 1.3, trusting only the certificate whose SHA-256 is `pin`
/// (hex, as the source's advert says it).
pub fn client_config(pin: &str) -> Result<Arc<ClientConfig>, String> {
    let provider = provider();
    let verifier = Pinned {
        fingerprint: pin.to_ascii_lowercase(),
        algorithms: provider.signature_verification_algorithms,
    };
    ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map(|builder| {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(verifier))
                .with_no_client_auth()
        })
        .map(Arc::new)
        .map_err(|err| format!("the transfer client's TLS: {err}"))
}

/// The name to connect to (never checked against the certificate: the pin is).
pub fn server_name() -> ServerName<'static> {
    ServerName::try_from(SERVER_NAME).expect("a valid DNS name")
}

/// Trusts one certificate, by its SHA-256, and checks the handshake's signatures with its key.
#[derive(Debug)]
struct Pinned {
    fingerprint: String,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if fingerprint(end_entity.as_ref()) == self.fingerprint {
            return Ok(ServerCertVerified::assertion());
        }
        Err(rustls::Error::General(
            "the source's certificate is not the one its advert names".into(),
        ))
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_rustls::{TlsAcceptor, TlsConnector};

    /// A TLS connection to a server with `identity`, trusting `pin`: what the client read.
    async fn exchange(identity: &Identity, pin: &str) -> Result<String, String> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let acceptor = TlsAcceptor::from(identity.server_config().unwrap());
        let server = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            if let Ok(mut tls) = acceptor.accept(tcp).await {
                let _ = tls.write_all(b"hello").await;
                let _ = tls.shutdown().await;
            }
        });
        let connector = TlsConnector::from(client_config(pin).unwrap());
        let tcp = tokio::net::TcpStream::connect(address).await.unwrap();
        let result = match connector.connect(server_name(), tcp).await {
            Ok(mut tls) => {
                let mut read = String::new();
                tls.read_to_string(&mut read)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(read)
            }
            Err(err) => Err(err.to_string()),
        };
        let _ = server.await;
        result
    }

    #[tokio::test]
    async fn a_puller_talks_only_to_the_certificate_it_pinned() {
        let source = Identity::generate().unwrap();
        assert_eq!(source.fingerprint.len(), 64);
        assert_eq!(
            exchange(&source, &source.fingerprint).await.unwrap(),
            "hello"
        );
        let impostor = Identity::generate().unwrap();
        assert_ne!(
            impostor.fingerprint, source.fingerprint,
            "a new pair each time"
        );
        let refused = exchange(&impostor, &source.fingerprint).await.unwrap_err();
        assert!(
            refused.contains("not the one its advert names"),
            "{refused}"
        );
    }
}
