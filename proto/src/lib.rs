//! muster's wire contract: the generated types, clients and servers of the
//! protobuf packages in `proto/muster/`, and the encoded descriptor set that
//! the servers expose through gRPC reflection.
//!
//! This crate owns nothing but the contract: no logic, no conversions. Each
//! service converts between these types and its domain types in its own
//! `grpc.rs`. A few stream messages are written by hand ([`frame`]): the
//! notifier's `SubscribeResponse` with its event already encoded, so that an
//! event sent to many subscribers is encoded once; the execution service's
//! worker stream with an assignment's shared memory encoded once for every
//! assignment that carries it, and left encoded by the worker that receives
//! it until read; the events it sends the notifier as they were stored.
#![allow(missing_docs, unreachable_pub, clippy::all)]

/// Shared types: diagnostics, step roles, step events.
pub mod common {
    /// Version 1.
    pub mod v1 {
        tonic::include_proto!("muster.common.v1");
    }
}

/// The validator's API.
pub mod validator {
    /// Version 1.
    pub mod v1 {
        tonic::include_proto!("muster.validator.v1");
    }
}

/// The roster's API.
pub mod roster {
    /// Version 1.
    pub mod v1 {
        tonic::include_proto!("muster.roster.v1");
    }
}

/// The execution service's API.
pub mod execution {
    /// Version 1.
    pub mod v1 {
        tonic::include_proto!("muster.execution.v1");

        /// The execution service's server once more, its ConnectWorker and
        /// RelaySteps streams yielding [`WorkerFrame`](crate::frame::WorkerFrame)s:
        /// what the execution service serves (the same wire contract).
        pub mod framed {
            include!(concat!(env!("OUT_DIR"), "/framed/muster.execution.v1.rs"));
        }

        /// The execution service's client once more, its ConnectWorker and
        /// RelaySteps streams yielding [`WorkerFrame`](crate::frame::WorkerFrame)s:
        /// an assignment's shared memory left as it came (the same wire
        /// contract).
        pub mod framed_client {
            include!(concat!(env!("OUT_DIR"), "/framed_client/muster.execution.v1.rs"));
        }
    }
}

/// The notifier's API.
pub mod notifier {
    /// Version 1.
    pub mod v1 {
        tonic::include_proto!("muster.notifier.v1");

        /// The notifier's server once more, its Subscribe stream yielding
        /// [`SubscribeFrame`](crate::frame::SubscribeFrame)s: what the
        /// notifier serves (the same wire contract).
        pub mod framed {
            include!(concat!(env!("OUT_DIR"), "/framed/muster.notifier.v1.rs"));
        }

        /// The notifier's client once more, its IngestEvents stream taking
        /// [`IngestFrame`](crate::frame::IngestFrame)s: events sent as they
        /// are stored (the same wire contract).
        pub mod framed_client {
            include!(concat!(env!("OUT_DIR"), "/framed_client/muster.notifier.v1.rs"));
        }
    }
}

pub mod frame;

pub mod limits;

/// The encoded `FileDescriptorSet` of every muster package, for reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("muster_descriptor");
