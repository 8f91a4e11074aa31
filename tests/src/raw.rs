//! Calling any method of the contract with encoded messages: for tests that
//! go over every RPC (who may call what) without a typed client for each.

use std::time::Duration;

use bytes::{Buf as _, BufMut as _};
use muster_runtime::auth::client::{AuthChannel, Credentials, with_credentials};
use prost::Message as _;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

/// A codec of already encoded messages.
#[derive(Debug, Clone, Copy, Default)]
pub struct RawCodec;

/// Encodes and decodes raw message bytes.
#[derive(Debug, Clone, Copy, Default)]
pub struct RawCoder;

impl Encoder for RawCoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(&mut self, item: Vec<u8>, destination: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        destination.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawCoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn decode(&mut self, source: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        Ok(Some(source.copy_to_bytes(source.remaining()).to_vec()))
    }
}

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCoder;
    type Decoder = RawCoder;

    fn encoder(&mut self) -> RawCoder {
        RawCoder
    }

    fn decoder(&mut self) -> RawCoder {
        RawCoder
    }
}

/// A method of the contract.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Method {
    /// `muster.roster.v1.RosterService`.
    pub service: String,
    /// `RotateToken`.
    pub name: String,
    /// Whether the client streams.
    pub client_streaming: bool,
    /// Whether the server streams.
    pub server_streaming: bool,
}

impl Method {
    /// `RosterService/RotateToken`, as tables name it.
    pub fn short(&self) -> String {
        format!("{}/{}", self.service.rsplit('.').next().unwrap_or_default(), self.name)
    }
}

/// Every method of every muster service in the contract.
pub fn contract_methods() -> Vec<Method> {
    let set = prost_types::FileDescriptorSet::decode(muster_proto::FILE_DESCRIPTOR_SET).expect("the descriptors");
    let mut methods = Vec::new();
    for file in &set.file {
        for service in &file.service {
            for method in &service.method {
                methods.push(Method {
                    service: format!("{}.{}", file.package(), service.name()),
                    name: method.name().to_owned(),
                    client_streaming: method.client_streaming(),
                    server_streaming: method.server_streaming(),
                });
            }
        }
    }
    methods
}

/// Calls `method` at `url` with one encoded request message and
/// `credentials`: `Ok` once the call is accepted (for a stream, once it
/// opened), else the status it ended with. Each call has 10 seconds.
pub async fn call(url: &str, method: &Method, request: Vec<u8>, credentials: Credentials) -> Result<(), tonic::Status> {
    let channel = tonic::transport::Endpoint::from_shared(url.to_owned()).expect("a URL").connect_lazy();
    let channel: AuthChannel = with_credentials(channel, credentials);
    let mut grpc = tonic::client::Grpc::new(channel);
    let path: http::uri::PathAndQuery = format!("/{}/{}", method.service, method.name).parse().expect("a method path");
    let attempt = async {
        grpc.ready().await.map_err(|error| tonic::Status::unavailable(error.to_string()))?;
        match (method.client_streaming, method.server_streaming) {
            (false, false) => grpc.unary(tonic::Request::new(request), path, RawCodec).await.map(drop),
            (false, true) => grpc.server_streaming(tonic::Request::new(request), path, RawCodec).await.map(drop),
            (true, false) => {
                let messages = tokio_stream::iter([request]);
                grpc.client_streaming(tonic::Request::new(messages), path, RawCodec).await.map(drop)
            }
            (true, true) => {
                // The stream stays open (a worker's hello is answered while it is).
                let messages = tokio_stream::iter([request]).chain(tokio_stream::pending());
                grpc.streaming(tonic::Request::new(messages), path, RawCodec).await.map(drop)
            }
        }
    };
    match tokio::time::timeout(Duration::from_secs(10), attempt).await {
        Ok(outcome) => outcome,
        Err(_) => panic!("{} did not answer within 10 s", method.short()),
    }
}

use tokio_stream::StreamExt as _;
