//! The execution service's rules, free of transport and storage: the states
//! of executions and steps and their names as stored ([`model`]), the order
//! steps may run in ([`dag`]), who may do what ([`authority`]), what a
//! session looks like to its members ([`session`]), which values travel by
//! reference ([`payload`]), the messages that start runs ([`inbox`]), the
//! limits on runs ([`budget`]), what a running attempt reports of its use
//! ([`progress`]), when scheduled runs fire ([`schedule`]), and what runs
//! remember ([`memory`]).

pub mod authority;
pub mod budget;
pub mod dag;
pub mod inbox;
pub mod memory;
pub mod model;
pub mod payload;
pub mod progress;
pub mod schedule;
pub mod session;

macro_rules! stored_enum {
    ($name:ident { $($variant:ident => $text:literal),* $(,)? }) => {
        impl $name {
            /// The name stored in the database.
            pub fn as_str(self) -> &'static str {
                match self { $(Self::$variant => $text),* }
            }
        }

        impl std::str::FromStr for $name {
            type Err = $crate::Error;

            fn from_str(text: &str) -> Result<Self, $crate::Error> {
                match text {
                    $($text => Ok(Self::$variant),)*
                    other => Err($crate::Error::Storage(format!("unknown {} {other:?} in the database", stringify!($name)))),
                }
            }
        }
    };
}
pub(crate) use stored_enum;

/// Where an execution is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecutionStatus {
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
    /// Whether the execution has ended (completed, failed or cancelled).
    pub fn is_final(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Cancelled)
    }
}

/// Where a step is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepStatus {
    Pending,
    Ready,
    Queued,
    WaitingForWorker,
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
    WaitingForWorker => "waiting_for_worker",
    Running => "running",
    WaitingApproval => "waiting_approval",
    Paused => "paused",
    Completed => "completed",
    Failed => "failed",
    Cancelled => "cancelled",
});

impl StepStatus {
    /// Whether the step has ended (completed, failed or cancelled).
    pub fn is_final(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Cancelled)
    }

    /// Handed on to be done: queued for an expert, waiting for a worker, or
    /// with one. (A ready step whose executor is being found is in flight
    /// too; the driver knows which.)
    pub fn is_in_flight(self) -> bool {
        matches!(self, Self::Queued | Self::WaitingForWorker | Self::Running)
    }
}
