//! The execution service's rules, free of transport and storage: the states
//! of executions and steps and their names as stored, who may do what
//! ([`authority`]), and what a session looks like to its members ([`session`]).

pub(crate) mod authority;
pub(crate) mod session;

use std::str::FromStr;

use muster_proto::{common::v1 as common, execution::v1 as wire};

use crate::Error;

macro_rules! stored_enum {
    ($name:ident { $($variant:ident => $text:literal),* $(,)? }) => {
        impl $name {
            /// The name stored in the database.
            pub(crate) fn as_str(self) -> &'static str {
                match self { $(Self::$variant => $text),* }
            }
        }

        impl FromStr for $name {
            type Err = Error;

            fn from_str(text: &str) -> Result<Self, Error> {
                match text {
                    $($text => Ok(Self::$variant),)*
                    other => Err(Error::Storage(format!("unknown {} {other:?} in the database", stringify!($name)))),
                }
            }
        }
    };
}

/// Where an execution is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ExecutionStatus {
    Running,
    Completed,
    Failed,
    Cancelled,
    Paused,
}

stored_enum!(ExecutionStatus {
    Running => "running",
    Completed => "completed",
    Failed => "failed",
    Cancelled => "cancelled",
    Paused => "paused",
});

impl ExecutionStatus {
    pub(crate) fn is_final(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Cancelled)
    }

    pub(crate) fn to_wire(self) -> common::ExecutionStatus {
        match self {
            Self::Running => common::ExecutionStatus::Running,
            Self::Completed => common::ExecutionStatus::Completed,
            Self::Failed => common::ExecutionStatus::Failed,
            Self::Cancelled => common::ExecutionStatus::Cancelled,
            Self::Paused => common::ExecutionStatus::Paused,
        }
    }

    pub(crate) fn from_wire(status: common::ExecutionStatus) -> Option<Self> {
        match status {
            common::ExecutionStatus::Unspecified => None,
            common::ExecutionStatus::Running => Some(Self::Running),
            common::ExecutionStatus::Completed => Some(Self::Completed),
            common::ExecutionStatus::Failed => Some(Self::Failed),
            common::ExecutionStatus::Cancelled => Some(Self::Cancelled),
            common::ExecutionStatus::Paused => Some(Self::Paused),
        }
    }
}

/// Where a step is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StepStatus {
    Pending,
    Ready,
    Queued,
    Running,
    WaitingApproval,
    Paused,
    Completed,
    Failed,
    Cancelled,
}

stored_enum!(StepStatus {
    Pending => "pending",
    Ready => "ready",
    Queued => "queued",
    Running => "running",
    WaitingApproval => "waiting_approval",
    Paused => "paused",
    Completed => "completed",
    Failed => "failed",
    Cancelled => "cancelled",
});

impl StepStatus {
    pub(crate) fn is_final(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Cancelled)
    }

    /// Held by a step task: looking for its executor, queued, or with a worker.
    pub(crate) fn is_in_flight(self) -> bool {
        matches!(self, Self::Running | Self::Queued)
    }

    pub(crate) fn to_wire(self) -> wire::StepStatus {
        match self {
            Self::Pending => wire::StepStatus::Pending,
            Self::Ready => wire::StepStatus::Ready,
            Self::Queued => wire::StepStatus::Queued,
            Self::Running => wire::StepStatus::Running,
            Self::WaitingApproval => wire::StepStatus::WaitingApproval,
            Self::Paused => wire::StepStatus::Paused,
            Self::Completed => wire::StepStatus::Completed,
            Self::Failed => wire::StepStatus::Failed,
            Self::Cancelled => wire::StepStatus::Cancelled,
        }
    }
}
