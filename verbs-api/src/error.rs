//! The API's errors, with the errno verbs would return.

use uroce_provider::device::{DeviceError, EngineError, McastError};

/// Result alias.
pub type Result<T> = std::result::Result<T, Error>;

/// What went wrong, in verbs' terms.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// Invalid argument (EINVAL), with what is wrong.
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// The object is still in use (EBUSY): destroy its dependents first.
    #[error("resource busy: {0}")]
    Busy(&'static str),
    /// Out of resources (ENOMEM), e.g. a full work queue.
    #[error("out of resources: {0}")]
    NoMemory(&'static str),
    /// No such device (ENODEV).
    #[error("no such device: {0}")]
    NoDevice(String),
    /// The engine could not start or has stopped (EIO).
    #[error("engine: {0}")]
    Engine(String),
    /// The device does not do this (EOPNOTSUPP), with why.
    #[error("not supported: {0}")]
    NotSupported(&'static str),
    /// Nothing to return without blocking (EAGAIN).
    #[error("would block")]
    WouldBlock,
    /// A signal handler interrupted the wait (EINTR).
    #[error("interrupted by a signal")]
    Interrupted,
    /// The address (or port) is taken (EADDRINUSE).
    #[error("address in use")]
    AddrInUse,
    /// No device serves the address (EADDRNOTAVAIL).
    #[error("no uroce device for address {0}")]
    AddrNotAvailable(String),
    /// The port is bound on the wildcard address while a specific one
    /// asks for it, or the other way round (EADDRNOTAVAIL, as the kernel's
    /// CMA answers).
    #[error("port {0} is bound on another address, one of them the wildcard")]
    PortConflict(u16),
    /// The entry asked for is empty (ENODATA), e.g. a GID table index
    /// past the populated ones.
    #[error("no data: {0}")]
    NoData(String),
}

impl Error {
    /// The errno value libibverbs would return.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Invalid(_) => libc_errno::EINVAL,
            Error::Busy(_) => libc_errno::EBUSY,
            Error::NoMemory(_) => libc_errno::ENOMEM,
            Error::NoDevice(_) => libc_errno::ENODEV,
            Error::Engine(_) => libc_errno::EIO,
            Error::NotSupported(_) => libc_errno::EOPNOTSUPP,
            Error::WouldBlock => libc_errno::EAGAIN,
            Error::Interrupted => libc_errno::EINTR,
            Error::AddrInUse => libc_errno::EADDRINUSE,
            Error::AddrNotAvailable(_) | Error::PortConflict(_) => libc_errno::EADDRNOTAVAIL,
            Error::NoData(_) => libc_errno::ENODATA,
        }
    }
}

impl Error {
    /// A failed wait on an event descriptor: EINTR is
    /// [`Error::Interrupted`], EAGAIN [`Error::WouldBlock`] (as the waits
    /// of this crate's channels report them; for the event channels of
    /// layers above, such as rdma_cm's).
    pub fn from_wait(e: std::io::Error) -> Error {
        match e.kind() {
            std::io::ErrorKind::Interrupted => Error::Interrupted,
            std::io::ErrorKind::WouldBlock => Error::WouldBlock,
            _ => Error::Engine(format!("event descriptor: {e}")),
        }
    }
}

mod libc_errno {
    pub const EINTR: i32 = 4;
    pub const EIO: i32 = 5;
    pub const EAGAIN: i32 = 11;
    pub const EOPNOTSUPP: i32 = 95;
    pub const ENOMEM: i32 = 12;
    pub const EBUSY: i32 = 16;
    pub const ENODEV: i32 = 19;
    pub const EINVAL: i32 = 22;
    pub const ENODATA: i32 = 61;
    pub const EADDRINUSE: i32 = 98;
    pub const EADDRNOTAVAIL: i32 = 99;
}

impl From<EngineError> for Error {
    fn from(e: EngineError) -> Error {
        match e {
            EngineError::Modify(m) => Error::Invalid(m.to_string()),
            EngineError::NoQp(_) => Error::Invalid(e.to_string()),
            EngineError::AddrInUse(_) => Error::AddrInUse,
            EngineError::Mcast(m) => match m {
                McastError::TooManyGroups
                | McastError::GroupFull
                | McastError::TooManyAttachments => Error::NoMemory(m.limit()),
                _ => Error::Invalid(m.to_string()),
            },
            // Out of descriptors or memberships: the device's resources.
            EngineError::Join { errno, .. } if [12, 23, 24, 105].contains(&errno) => {
                Error::NoMemory("a socket for the multicast group")
            }
            other => Error::Engine(other.to_string()),
        }
    }
}

impl From<DeviceError> for Error {
    fn from(e: DeviceError) -> Error {
        match e {
            DeviceError::Invalid(m) => Error::Invalid(m),
            DeviceError::NoMemory(m) => Error::NoMemory(m),
            DeviceError::NotSupported(m) => Error::NotSupported(m),
            DeviceError::Busy(m) => Error::Busy(m),
            DeviceError::Engine(e) => e.into(),
        }
    }
}
