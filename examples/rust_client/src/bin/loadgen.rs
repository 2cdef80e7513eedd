//! Load on a fastrollout policy server: `--clients` threads, one connection each, run
//! episodes as fast as the server answers and time every `get_action` round trip.
//!
//! ```text
//! loadgen --address 127.0.0.1:PORT [--clients 1] [--seconds 5 | --actions-per-client K]
//!         [--obs-dim 4] [--episode-len 100] [--warmup-s 1] [--token T] [--timeout-s 60]
//! ```
//!
//! Each client loops: `start_episode`, then `--episode-len` times `get_action` (a synthetic
//! observation inside Box(-1, 1, (obs_dim,), float32)) and `log_returns`, then `end_episode`.
//! All clients connect first and start together; the first `--warmup-s` seconds are not
//! counted. Then either `--seconds` of load (every client ends its episode at the first step
//! after the window) or `--actions-per-client` counted actions per client. A client that
//! stops ends its open episode with `end_episode`.
//!
//! Prints one JSON object: `clients`, `total_actions` (counted `get_action` calls),
//! `seconds` (from the end of the warm-up to the last counted reply), `actions_per_s`,
//! `p50_us`, `p90_us`, `p99_us`, `max_us`, `mean_us` (round-trip latency of the counted
//! calls), `episodes` (ended in the whole run), `obs_dim`, `episode_len`, `warmup_s`.
//! Exit code 0 on success, 1 if any client failed, 2 on bad arguments.

use std::process::ExitCode;
use std::sync::{Arc, Barrier, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use fastrollout_client::cli::{json_number, Args};
use fastrollout_client::{ClientError, ClientOptions, NdArray, PolicyClient};

const USAGE: &str =
    "usage: loadgen --address HOST:PORT [--clients N] [--seconds S | --actions-per-client K] \
                     [--obs-dim D] [--episode-len L] [--warmup-s W] [--token T] [--timeout-s S]";

#[derive(Clone, Copy)]
enum Stop {
    After(Duration),
    Actions(u64),
}

struct Config {
    address: String,
    clients: usize,
    stop: Stop,
    obs_dim: usize,
    episode_len: u32,
    warmup: Duration,
    options: ClientOptions,
}

fn positive_seconds(args: &Args, name: &str, default: f64, zero_ok: bool) -> Result<Duration, String> {
    let s: f64 = args.get_or(name, default)?;
    if !s.is_finite() || s < 0.0 || (s == 0.0 && !zero_ok) {
        return Err(format!(
            "--{name} must be a {} number of seconds",
            if zero_ok { "non-negative" } else { "positive" }
        ));
    }
    Ok(Duration::from_secs_f64(s))
}

fn config() -> Result<Config, String> {
    let args = Args::parse(
        std::env::args().skip(1),
        &[
            "address",
            "clients",
            "seconds",
            "actions-per-client",
            "obs-dim",
            "episode-len",
            "warmup-s",
            "token",
            "timeout-s",
        ],
        USAGE,
    )?;
    let stop = match (args.get::<f64>("seconds")?, args.get::<u64>("actions-per-client")?) {
        (Some(_), Some(_)) => return Err("give --seconds or --actions-per-client, not both".into()),
        (_, Some(0)) => return Err("--actions-per-client must be at least 1".into()),
        (_, Some(k)) => Stop::Actions(k),
        _ => Stop::After(positive_seconds(&args, "seconds", 5.0, false)?),
    };
    let clients = args.get_or("clients", 1)?;
    let obs_dim = args.get_or("obs-dim", 4)?;
    let episode_len = args.get_or("episode-len", 100)?;
    if clients == 0 || obs_dim == 0 || episode_len == 0 {
        return Err("--clients, --obs-dim and --episode-len must be at least 1".into());
    }
    let timeout = positive_seconds(&args, "timeout-s", 60.0, false)?;
    Ok(Config {
        address: args.get("address")?.ok_or_else(|| format!("--address is required\n{USAGE}"))?,
        clients,
        stop,
        obs_dim,
        episode_len,
        warmup: positive_seconds(&args, "warmup-s", 1.0, true)?,
        options: ClientOptions {
            token: args.get("token")?,
            io_timeout: Some(timeout),
            connect_timeout: timeout.min(Duration::from_secs(10)),
            client_name: concat!("fastrollout-loadgen/", env!("CARGO_PKG_VERSION")).into(),
            ..ClientOptions::default()
        },
    })
}

/// What one client measured.
#[derive(Default)]
struct Tally {
    latencies_ns: Vec<u64>,
    last_reply: Option<Instant>,
    episodes: u64,
}

/// A fixed observation for step `t`, inside [-0.9, 0.9].
fn observation(buf: &mut [f32], t: u32) {
    for (i, v) in buf.iter_mut().enumerate() {
        *v = 0.9 * (0.1 * t as f32 + i as f32).sin();
    }
}

fn client_loop(cfg: &Config, client: &mut PolicyClient, start: Instant) -> Result<Tally, ClientError> {
    let measure_from = start + cfg.warmup;
    let mut tally = Tally::default();
    let mut obs = vec![0.0f32; cfg.obs_dim];
    loop {
        let episode = client.start_episode(None, true)?;
        let mut stop = false;
        for t in 0..cfg.episode_len {
            observation(&mut obs, t);
            let sent = Instant::now();
            client.get_action(&episode, NdArray::vector_f32(&obs))?;
            let replied = Instant::now();
            if sent >= measure_from {
                tally.latencies_ns.push(u64::try_from((replied - sent).as_nanos()).unwrap_or(u64::MAX));
                tally.last_reply = Some(replied);
            }
            client.log_returns(&episode, 1.0, None)?;
            stop = match cfg.stop {
                Stop::After(window) => replied >= measure_from + window,
                Stop::Actions(k) => tally.latencies_ns.len() as u64 >= k,
            };
            if stop {
                break;
            }
        }
        observation(&mut obs, cfg.episode_len);
        client.end_episode(&episode, NdArray::vector_f32(&obs))?;
        tally.episodes += 1;
        if stop {
            return Ok(tally);
        }
    }
}

/// The value at quantile `q` of sorted `v` (nearest rank).
fn quantile(v: &[u64], q: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    #[allow(clippy::cast_sign_loss)] // q and the length are non-negative
    let rank = (q * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

fn run(cfg: &Arc<Config>) -> Result<String, String> {
    let barrier = Arc::new(Barrier::new(cfg.clients));
    let start: Arc<OnceLock<Instant>> = Arc::new(OnceLock::new());
    let handles: Vec<_> = (0..cfg.clients)
        .map(|i| {
            let (cfg, barrier, start) = (Arc::clone(cfg), Arc::clone(&barrier), Arc::clone(&start));
            thread::Builder::new()
                .name(format!("loadgen-{i}"))
                .spawn(move || {
                    let connected = PolicyClient::connect(cfg.address.as_str(), &cfg.options);
                    // Every thread reaches the barrier, connected or not, so none waits for ever.
                    barrier.wait();
                    let t0 = *start.get_or_init(Instant::now);
                    client_loop(&cfg, &mut connected?, t0)
                })
                .map_err(|e| format!("cannot start client thread {i}: {e}"))
        })
        .collect::<Result<_, _>>()?;
    let mut tallies = Vec::with_capacity(handles.len());
    let mut errors = Vec::new();
    for (i, h) in handles.into_iter().enumerate() {
        match h.join() {
            Ok(Ok(t)) => tallies.push(t),
            Ok(Err(e)) => errors.push(format!("client {i}: {e}")),
            Err(_) => errors.push(format!("client {i}: thread panicked")),
        }
    }
    if !errors.is_empty() {
        return Err(errors.join("\n"));
    }
    let t0 = *start.get().ok_or("no client started")?;
    let measure_from = t0 + cfg.warmup;
    let mut latencies: Vec<u64> = tallies.iter().flat_map(|t| t.latencies_ns.iter().copied()).collect();
    latencies.sort_unstable();
    let last_reply = tallies.iter().filter_map(|t| t.last_reply).max().unwrap_or(measure_from);
    let seconds = last_reply.saturating_duration_since(measure_from).as_secs_f64();
    let total = latencies.len() as u64;
    let us = |ns: u64| json_number((ns as f64 / 100.0).round() / 10.0);
    let mean_ns = if latencies.is_empty() {
        0.0
    } else {
        latencies.iter().map(|&n| n as f64).sum::<f64>() / latencies.len() as f64
    };
    Ok(format!(
        "{{\"clients\":{},\"total_actions\":{},\"seconds\":{},\"actions_per_s\":{},\"p50_us\":{},\"p90_us\":{},\
         \"p99_us\":{},\"max_us\":{},\"mean_us\":{},\"episodes\":{},\"obs_dim\":{},\"episode_len\":{},\"warmup_s\":{}}}",
        cfg.clients,
        total,
        json_number((seconds * 1e4).round() / 1e4),
        json_number(if seconds > 0.0 { (total as f64 / seconds).round() } else { 0.0 }),
        us(quantile(&latencies, 0.5)),
        us(quantile(&latencies, 0.9)),
        us(quantile(&latencies, 0.99)),
        us(latencies.last().copied().unwrap_or(0)),
        json_number((mean_ns / 100.0).round() / 10.0),
        tallies.iter().map(|t| t.episodes).sum::<u64>(),
        cfg.obs_dim,
        cfg.episode_len,
        json_number(cfg.warmup.as_secs_f64()),
    ))
}

fn main() -> ExitCode {
    let cfg = match config() {
        Ok(cfg) => cfg,
        Err(msg) => {
            eprintln!("loadgen: {msg}");
            return ExitCode::from(2);
        }
    };
    match run(&Arc::new(cfg)) {
        Ok(json) => {
            println!("{json}");
            ExitCode::SUCCESS
        }
        Err(msg) => {
            eprintln!("loadgen: {msg}");
            ExitCode::FAILURE
        }
    }
}
