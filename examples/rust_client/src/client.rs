//! `PolicyClient`: one connection to a policy server, remote inference mode.

use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

use rmpv::Value;

use crate::array::NdArray;
use crate::error::ClientError;
use crate::frame::{self, get, message, message_type, DEFAULT_MAX_FRAME_BYTES};

/// The protocol version this client speaks.
pub const PROTOCOL_VERSION: u64 = 1;

/// Who acts: the server's policy (`Remote`) or the client itself (`Local`; this client sends
/// `log_action` for its own actions and does not implement `get_weights`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InferenceMode {
    Remote,
    Local,
}

impl InferenceMode {
    fn name(self) -> &'static str {
        match self {
            Self::Remote => "remote",
            Self::Local => "local",
        }
    }
}

/// How to connect.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// The server's token, if it was started with one.
    pub token: Option<String>,
    pub inference_mode: InferenceMode,
    /// Limit for establishing the TCP connection (per resolved address).
    pub connect_timeout: Duration,
    /// Limit for each read and write on the socket; `None` waits for ever. A `get_action`
    /// waits until the server's runner samples, so this bounds how long a client waits for
    /// a runner that is not sampling.
    pub io_timeout: Option<Duration>,
    /// Largest frame accepted from the server.
    pub max_frame_bytes: usize,
    /// Sent in `hello` as `client`, for the server's logs.
    pub client_name: String,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            token: None,
            inference_mode: InferenceMode::Remote,
            connect_timeout: Duration::from_secs(10),
            io_timeout: Some(Duration::from_secs(60)),
            max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
            client_name: concat!("fastrollout-rust-client/", env!("CARGO_PKG_VERSION")).into(),
        }
    }
}

/// The server's `welcome`.
#[derive(Debug, Clone, PartialEq)]
pub struct Welcome {
    pub protocol: u64,
    /// `"fastrollout <version>"`.
    pub server: String,
    pub multi_agent: bool,
    /// Spaces as the protocol describes them (maps with a `"type"`), undecoded.
    pub observation_space: Value,
    pub action_space: Value,
    /// The largest frame the server accepts; this client refuses to send a larger one.
    pub max_frame_bytes: usize,
}

/// An action the server sent: an int for `Discrete`, an array for `Box`, `MultiDiscrete` and
/// `MultiBinary`, any other value (`Dict`, `Tuple`, agent dicts) as it came.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    Discrete(i64),
    Array(NdArray),
    Other(Value),
}

impl Action {
    /// Reads an action value.
    pub fn from_value(value: Value) -> Result<Self, ClientError> {
        match value {
            Value::Integer(i) => i
                .as_i64()
                .map(Self::Discrete)
                .ok_or_else(|| ClientError::Protocol(format!("action {i} does not fit an i64"))),
            Value::Ext(..) => Ok(Self::Array(NdArray::from_value(&value)?)),
            other => Ok(Self::Other(other)),
        }
    }

    /// The action of a `Discrete` space: an int, or an integer array of one item.
    #[must_use]
    pub fn as_discrete(&self) -> Option<i64> {
        match self {
            Self::Discrete(a) => Some(*a),
            Self::Array(a) if a.len() == 1 => a.to_i64_vec().map(|v| v[0]),
            _ => None,
        }
    }

    /// The array of a `Box`, `MultiDiscrete` or `MultiBinary` space.
    #[must_use]
    pub fn as_array(&self) -> Option<&NdArray> {
        match self {
            Self::Array(a) => Some(a),
            _ => None,
        }
    }

    /// The action as a msgpack value (for `log_action`).
    #[must_use]
    pub fn to_value(&self) -> Value {
        match self {
            Self::Discrete(a) => Value::from(*a),
            Self::Array(a) => a.to_value(),
            Self::Other(v) => v.clone(),
        }
    }
}

/// One connection to a policy server, speaking protocol version 1.
///
/// Requests and replies alternate strictly, so a client serves one thread; open one client
/// per thread to run episodes in parallel.
///
/// ```no_run
/// use fastrollout_client::{NdArray, PolicyClient, ClientOptions};
/// let mut client = PolicyClient::connect("127.0.0.1:9900", &ClientOptions::default())?;
/// let episode = client.start_episode(None, true)?;
/// let action = client.get_action(&episode, NdArray::vector_f32(&[0.0; 4]))?;
/// client.log_returns(&episode, 1.0, None)?;
/// client.end_episode(&episode, NdArray::vector_f32(&[0.0; 4]))?;
/// # let _ = action;
/// # Ok::<(), fastrollout_client::ClientError>(())
/// ```
#[derive(Debug)]
pub struct PolicyClient {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    /// Reused for every outgoing frame.
    out: Vec<u8>,
    max_frame_bytes: usize,
    welcome: Welcome,
}

impl PolicyClient {
    /// Connects and handshakes: `hello` with the options' token and mode, `welcome` back.
    ///
    /// A server that refuses (`protocol_version`, `unauthorized`) gives `ClientError::Server`.
    pub fn connect(address: impl ToSocketAddrs, options: &ClientOptions) -> Result<Self, ClientError> {
        let addrs: Vec<SocketAddr> = address.to_socket_addrs()?.collect();
        let mut last_err = None;
        let mut stream = None;
        for addr in &addrs {
            match TcpStream::connect_timeout(addr, options.connect_timeout) {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) => last_err = Some(e),
            }
        }
        let Some(stream) = stream else {
            return Err(last_err.map_or_else(
                || ClientError::Protocol("the address resolved to nothing".into()),
                ClientError::from,
            ));
        };
        // Requests are small and each waits for its reply: Nagle's algorithm would hold
        // every one back for the delayed ACK (40 ms on Linux).
        stream.set_nodelay(true)?;
        stream.set_read_timeout(options.io_timeout)?;
        stream.set_write_timeout(options.io_timeout)?;
        let writer = stream.try_clone()?;
        let mut client = Self {
            reader: BufReader::with_capacity(64 << 10, stream),
            writer,
            out: Vec::with_capacity(4 << 10),
            max_frame_bytes: options.max_frame_bytes,
            welcome: Welcome {
                protocol: PROTOCOL_VERSION,
                server: String::new(),
                multi_agent: false,
                observation_space: Value::Nil,
                action_space: Value::Nil,
                max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
            },
        };
        let hello = message(
            "hello",
            vec![
                ("protocol", Value::from(PROTOCOL_VERSION)),
                ("inference_mode", Value::from(options.inference_mode.name())),
                ("token", options.token.as_deref().map_or(Value::Nil, Value::from)),
                ("client", Value::from(options.client_name.as_str())),
            ],
        );
        let reply = client.request(&hello, "welcome")?;
        client.welcome = parse_welcome(&reply)?;
        Ok(client)
    }

    /// The server's `welcome`.
    #[must_use]
    pub fn welcome(&self) -> &Welcome {
        &self.welcome
    }

    /// Starts an episode; `None` lets the server choose the id. Returns the episode's id.
    pub fn start_episode(
        &mut self,
        episode_id: Option<&str>,
        training_enabled: bool,
    ) -> Result<String, ClientError> {
        let req = message(
            "start_episode",
            vec![
                ("episode_id", episode_id.map_or(Value::Nil, Value::from)),
                ("training_enabled", Value::from(training_enabled)),
            ],
        );
        let reply = self.request(&req, "episode_started")?;
        match get(&reply, "episode_id") {
            Some(Value::String(s)) => s
                .as_str()
                .map(str::to_owned)
                .ok_or_else(|| ClientError::Protocol("episode_id is not UTF-8".into())),
            other => {
                Err(ClientError::Protocol(format!("episode_started without a string episode_id: {other:?}")))
            }
        }
    }

    /// Records `observation` and returns the policy's action for it (remote mode).
    pub fn get_action(
        &mut self,
        episode_id: &str,
        observation: impl Into<Value>,
    ) -> Result<Action, ClientError> {
        let req = message(
            "get_action",
            vec![("episode_id", Value::from(episode_id)), ("observation", observation.into())],
        );
        let reply = self.request(&req, "action")?;
        let Value::Map(entries) = reply else {
            return Err(ClientError::Protocol("action reply is not a map".into()));
        };
        let action = entries
            .into_iter()
            .find(|(k, _)| k.as_str() == Some("action"))
            .map(|(_, v)| v)
            .ok_or_else(|| ClientError::Protocol("action reply without \"action\"".into()))?;
        Action::from_value(action)
    }

    /// Records an action the simulator chose itself for `observation`.
    pub fn log_action(
        &mut self,
        episode_id: &str,
        observation: impl Into<Value>,
        action: impl Into<Value>,
    ) -> Result<(), ClientError> {
        let req = message(
            "log_action",
            vec![
                ("episode_id", Value::from(episode_id)),
                ("observation", observation.into()),
                ("action", action.into()),
            ],
        );
        self.request(&req, "ok").map(drop)
    }

    /// Adds `reward` to the episode's current step (rewards add up until the next action).
    pub fn log_returns(
        &mut self,
        episode_id: &str,
        reward: f64,
        info: Option<Value>,
    ) -> Result<(), ClientError> {
        let req = message(
            "log_returns",
            vec![
                ("episode_id", Value::from(episode_id)),
                ("reward", Value::from(reward)),
                ("info", info.unwrap_or(Value::Nil)),
                ("done", Value::Nil),
            ],
        );
        self.request(&req, "ok").map(drop)
    }

    /// Ends the episode (as terminated) with its last observation.
    pub fn end_episode(
        &mut self,
        episode_id: &str,
        observation: impl Into<Value>,
    ) -> Result<(), ClientError> {
        let req = message(
            "end_episode",
            vec![("episode_id", Value::from(episode_id)), ("observation", observation.into())],
        );
        self.request(&req, "ok").map(drop)
    }

    /// A round trip that changes nothing.
    pub fn ping(&mut self) -> Result<(), ClientError> {
        self.request(&message("ping", vec![]), "pong").map(drop)
    }

    /// Sends one request and reads its reply, which must be of type `expect`; an `error` reply
    /// becomes `ClientError::Server`.
    pub fn request(&mut self, body: &Value, expect: &str) -> Result<Value, ClientError> {
        self.out.clear();
        frame::encode_frame(body, &mut self.out, self.welcome.max_frame_bytes)?;
        self.writer.write_all(&self.out)?;
        let reply = frame::read_frame(&mut self.reader, self.max_frame_bytes)?;
        match message_type(&reply) {
            Some(t) if t == expect => Ok(reply),
            Some("error") => Err(server_error(&reply)),
            other => Err(ClientError::Protocol(format!("expected a {expect:?} reply, got {other:?}"))),
        }
    }
}

fn server_error(reply: &Value) -> ClientError {
    let text = |key| get(reply, key).and_then(Value::as_str).unwrap_or_default().to_owned();
    ClientError::Server { code: text("code"), message: text("message") }
}

fn parse_welcome(reply: &Value) -> Result<Welcome, ClientError> {
    let missing = |key: &str| ClientError::Protocol(format!("welcome without a valid {key:?}"));
    let protocol = get(reply, "protocol").and_then(Value::as_u64).ok_or_else(|| missing("protocol"))?;
    if protocol != PROTOCOL_VERSION {
        return Err(ClientError::Protocol(format!(
            "the server speaks protocol {protocol}, this client {PROTOCOL_VERSION}"
        )));
    }
    let max_frame_bytes = get(reply, "max_frame_bytes")
        .and_then(Value::as_u64)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| missing("max_frame_bytes"))?;
    Ok(Welcome {
        protocol,
        server: get(reply, "server").and_then(Value::as_str).unwrap_or_default().to_owned(),
        multi_agent: get(reply, "multi_agent")
            .and_then(Value::as_bool)
            .ok_or_else(|| missing("multi_agent"))?,
        observation_space: get(reply, "observation_space")
            .cloned()
            .ok_or_else(|| missing("observation_space"))?,
        action_space: get(reply, "action_space").cloned().ok_or_else(|| missing("action_space"))?,
        max_frame_bytes,
    })
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;
    use std::thread;

    use super::*;

    fn welcome_frame() -> Value {
        message(
            "welcome",
            vec![
                ("protocol", Value::from(1)),
                ("server", Value::from("fastrollout test")),
                ("multi_agent", Value::from(false)),
                ("observation_space", message("Box", vec![])),
                ("action_space", message("Discrete", vec![("n", Value::from(2)), ("start", Value::from(0))])),
                ("max_frame_bytes", Value::from(1024)),
            ],
        )
    }

    /// A scripted server: answers each request with the next reply and returns the requests.
    fn scripted_server(replies: Vec<Value>) -> (SocketAddr, thread::JoinHandle<Vec<Value>>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let handle = thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut seen = Vec::new();
            for reply in replies {
                seen.push(frame::read_frame(&mut s, DEFAULT_MAX_FRAME_BYTES).unwrap());
                frame::write_frame(&mut s, &reply, DEFAULT_MAX_FRAME_BYTES).unwrap();
            }
            seen
        });
        (addr, handle)
    }

    #[test]
    fn a_remote_episode_sends_the_documented_requests() {
        let (addr, server) = scripted_server(vec![
            welcome_frame(),
            message("episode_started", vec![("episode_id", Value::from("e1"))]),
            message("action", vec![("action", Value::from(1))]),
            message("ok", vec![]),
            message("ok", vec![]),
            message("pong", vec![]),
        ]);
        let opts = ClientOptions { token: Some("secret".into()), ..ClientOptions::default() };
        let mut c = PolicyClient::connect(addr, &opts).unwrap();
        assert_eq!(c.welcome().max_frame_bytes, 1024);
        assert_eq!(c.welcome().server, "fastrollout test");
        let ep = c.start_episode(None, true).unwrap();
        assert_eq!(ep, "e1");
        let obs = NdArray::vector_f32(&[0.1, 0.2, 0.3, 0.4]);
        assert_eq!(c.get_action(&ep, &obs).unwrap().as_discrete(), Some(1));
        c.log_returns(&ep, 1.0, None).unwrap();
        c.end_episode(&ep, &obs).unwrap();
        c.ping().unwrap();
        let seen = server.join().unwrap();
        let types: Vec<_> = seen.iter().map(|m| message_type(m).unwrap().to_owned()).collect();
        assert_eq!(types, ["hello", "start_episode", "get_action", "log_returns", "end_episode", "ping"]);
        assert_eq!(get(&seen[0], "protocol"), Some(&Value::from(1)));
        assert_eq!(get(&seen[0], "token"), Some(&Value::from("secret")));
        assert_eq!(get(&seen[0], "inference_mode"), Some(&Value::from("remote")));
        assert_eq!(get(&seen[1], "episode_id"), Some(&Value::Nil));
        assert_eq!(NdArray::from_value(get(&seen[2], "observation").unwrap()).unwrap(), obs);
        assert_eq!(get(&seen[3], "done"), Some(&Value::Nil));
    }

    #[test]
    fn server_errors_carry_code_and_message() {
        let (addr, server) = scripted_server(vec![
            welcome_frame(),
            message(
                "error",
                vec![
                    ("code", Value::from("invalid_request")),
                    ("message", Value::from("unknown episode 'x'")),
                ],
            ),
        ]);
        let mut c = PolicyClient::connect(addr, &ClientOptions::default()).unwrap();
        let err = c.get_action("x", NdArray::vector_f32(&[0.0])).unwrap_err();
        assert_eq!(err.server_code(), Some("invalid_request"));
        assert_eq!(err.to_string(), "server error [invalid_request]: unknown episode 'x'");
        server.join().unwrap();
    }

    #[test]
    fn a_refused_hello_is_a_server_error_and_a_wrong_reply_a_protocol_error() {
        let refusal = message(
            "error",
            vec![("code", Value::from("unauthorized")), ("message", Value::from("bad token"))],
        );
        let (addr, server) = scripted_server(vec![refusal]);
        let err = PolicyClient::connect(addr, &ClientOptions::default()).unwrap_err();
        assert_eq!(err.server_code(), Some("unauthorized"));
        server.join().unwrap();

        let (addr, server) = scripted_server(vec![welcome_frame(), message("ok", vec![])]);
        let mut c = PolicyClient::connect(addr, &ClientOptions::default()).unwrap();
        assert!(matches!(c.ping(), Err(ClientError::Protocol(_))));
        server.join().unwrap();
    }

    #[test]
    fn frames_above_the_servers_limit_are_not_sent() {
        let (addr, server) = scripted_server(vec![welcome_frame()]);
        let mut c = PolicyClient::connect(addr, &ClientOptions::default()).unwrap();
        let err = c.get_action("e", NdArray::vector_f32(&[0.0; 1000])).unwrap_err();
        assert!(matches!(err, ClientError::FrameTooLarge { max: 1024, .. }));
        server.join().unwrap();
    }

    #[test]
    fn a_closed_connection_and_a_timeout_are_errors_not_hangs() {
        // The server answers the hello, then closes.
        let (addr, server) = scripted_server(vec![welcome_frame()]);
        let mut c = PolicyClient::connect(addr, &ClientOptions::default()).unwrap();
        server.join().unwrap();
        assert!(matches!(c.ping(), Err(ClientError::Closed | ClientError::Io(_))));

        // A server that accepts and never answers.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let opts = ClientOptions { io_timeout: Some(Duration::from_millis(100)), ..ClientOptions::default() };
        let err = PolicyClient::connect(listener.local_addr().unwrap(), &opts).unwrap_err();
        assert!(matches!(err, ClientError::TimedOut), "{err}");
    }

    #[test]
    fn actions_decode_by_space() {
        assert_eq!(Action::from_value(Value::from(3)).unwrap(), Action::Discrete(3));
        let boxed = NdArray::from_f32(vec![2], &[0.5, -0.5]).unwrap();
        let a = Action::from_value(boxed.to_value()).unwrap();
        assert_eq!(a.as_array(), Some(&boxed));
        assert_eq!(a.as_discrete(), None);
        let scalar = Action::from_value(NdArray::from_i64(vec![], &[1]).unwrap().to_value()).unwrap();
        assert_eq!(scalar.as_discrete(), Some(1));
        assert!(Action::from_value(Value::from(u64::MAX)).unwrap_err().to_string().contains("i64"));
        assert!(Action::from_value(Value::Ext(1, vec![0xc0])).is_err());
    }
}
