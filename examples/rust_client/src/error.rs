//! The client's error types: one for arrays, one for everything a connection can meet.

use std::fmt;
use std::io;

/// An ext-type-1 array that cannot be built or read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArrayError {
    /// A dtype name the protocol does not list.
    UnknownDtype(String),
    /// `data` does not hold `prod(shape) * itemsize` bytes.
    DataLength { expected: usize, actual: usize },
    /// The shape's item count or byte size overflows `usize`.
    ShapeOverflow(Vec<u64>),
    /// Not an ext type 1 whose payload is `[dtype: str, shape: [u64], data: bin]`.
    Malformed(String),
}

impl fmt::Display for ArrayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnknownDtype(name) => write!(f, "unknown array dtype {name:?}"),
            Self::DataLength { expected, actual } => {
                write!(f, "array data holds {actual} bytes, its dtype and shape need {expected}")
            }
            Self::ShapeOverflow(shape) => write!(f, "array shape {shape:?} is too large"),
            Self::Malformed(why) => write!(f, "malformed array: {why}"),
        }
    }
}

impl std::error::Error for ArrayError {}

/// Everything that can go wrong between a client and the policy server.
#[derive(Debug)]
pub enum ClientError {
    /// Connecting, reading or writing failed.
    Io(io::Error),
    /// No answer within the client's `io_timeout` (or no connection within
    /// `connect_timeout`). A policy server answers once its runner samples: its env's
    /// thread, which serves, starts with the runner's first `sample()`.
    TimedOut,
    /// The server closed the connection.
    Closed,
    /// A frame longer than the limit: the server's (`max_frame_bytes` of its `welcome`) for
    /// one this client would send, this client's own for one it received.
    FrameTooLarge { length: usize, max: usize },
    /// A frame body that is not exactly one msgpack value.
    Decode(String),
    /// Well-formed msgpack that is not what the protocol says (a reply of another type, a
    /// missing key, a welcome of another protocol version).
    Protocol(String),
    /// An array that cannot be encoded or decoded.
    Array(ArrayError),
    /// The server answered with an `error` frame. Whether the connection stays open depends on
    /// `code` (docs/protocol.md, "Errors"): only `invalid_request` leaves it open.
    Server { code: String, message: String },
}

impl ClientError {
    /// The server's error code, for an `error` frame.
    #[must_use]
    pub fn server_code(&self) -> Option<&str> {
        match self {
            Self::Server { code, .. } => Some(code),
            _ => None,
        }
    }
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Io(e) => write!(f, "I/O error: {e}"),
            Self::Closed => f.write_str("the server closed the connection"),
            Self::TimedOut => f.write_str("timed out waiting for the server"),
            Self::FrameTooLarge { length, max } => {
                write!(f, "frame of {length} bytes exceeds the limit of {max} bytes")
            }
            Self::Decode(why) => write!(f, "undecodable frame: {why}"),
            Self::Protocol(why) => write!(f, "protocol violation: {why}"),
            Self::Array(e) => e.fmt(f),
            Self::Server { code, message } => write!(f, "server error [{code}]: {message}"),
        }
    }
}

impl std::error::Error for ClientError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Io(e) => Some(e),
            Self::Array(e) => Some(e),
            _ => None,
        }
    }
}

impl From<io::Error> for ClientError {
    fn from(e: io::Error) -> Self {
        match e.kind() {
            io::ErrorKind::UnexpectedEof => Self::Closed,
            // A socket read timeout is WouldBlock on Unix and TimedOut on Windows.
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Self::TimedOut,
            _ => Self::Io(e),
        }
    }
}

impl From<ArrayError> for ClientError {
    fn from(e: ArrayError) -> Self {
        Self::Array(e)
    }
}
