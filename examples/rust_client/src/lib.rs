//! A client of fastrollout's policy server in Rust: a simulator outside Python connects over
//! TCP and speaks the wire protocol of `docs/protocol.md` (version 1): length-prefixed msgpack
//! frames, arrays as msgpack extension type 1, a `hello`/`welcome` handshake.
//!
//! - [`PolicyClient`]: one connection, remote inference (`start_episode`, `get_action`,
//!   `log_action`, `log_returns`, `end_episode`, `ping`).
//! - [`NdArray`]: arrays as they travel; [`frame`]: the frame codec.
//! - [`cartpole::CartPole`]: the simulator of the `cartpole_client` binary.
//!
//! The binaries `cartpole_client` (CartPole episodes served by the server's policy) and
//! `loadgen` (many connections, `get_action` latency and throughput) use the library; see
//! `README.md` beside this crate.

pub mod array;
pub mod cartpole;
pub mod cli;
pub mod client;
pub mod error;
pub mod frame;

pub use array::{DType, NdArray, ARRAY_EXT_TYPE};
pub use client::{Action, ClientOptions, InferenceMode, PolicyClient, Welcome, PROTOCOL_VERSION};
pub use error::{ArrayError, ClientError};
pub use rmpv::Value;
