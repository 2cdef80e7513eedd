//! CartPole in Rust, acted by a fastrollout policy server (remote inference).
//!
//! ```text
//! cartpole_client --address 127.0.0.1:PORT [--episodes 3] [--max-steps 200] [--seed 0]
//!                 [--episode-prefix P] [--token T] [--timeout-s 60]
//! ```
//!
//! Prints one JSON line per episode: `episode_id`, `length`, `return`, `terminated` (the pole
//! fell), `truncated` (the episode reached `--max-steps`; the protocol ends every episode with
//! `end_episode`, so the server records it as terminated), `actions` (as received) and
//! `observations` (`length + 1` of them, the last one the one sent with `end_episode`).
//! Exit code 0 on success, 1 on a connection or protocol error, 2 on bad arguments.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use fastrollout_client::cartpole::{CartPole, OBS_DIM};
use fastrollout_client::cli::{json_number, json_string, Args};
use fastrollout_client::{ClientOptions, NdArray, PolicyClient};

const USAGE: &str = "usage: cartpole_client --address HOST:PORT [--episodes N] [--max-steps N] [--seed N] \
                     [--episode-prefix P] [--token T] [--timeout-s S]";

struct Config {
    address: String,
    episodes: u32,
    max_steps: u32,
    seed: u64,
    episode_prefix: Option<String>,
    options: ClientOptions,
}

fn config() -> Result<Config, String> {
    let args = Args::parse(
        std::env::args().skip(1),
        &["address", "episodes", "max-steps", "seed", "episode-prefix", "token", "timeout-s"],
        USAGE,
    )?;
    let timeout_s: f64 = args.get_or("timeout-s", 60.0)?;
    if !(timeout_s.is_finite() && timeout_s > 0.0) {
        return Err("--timeout-s must be a positive number".into());
    }
    let max_steps = args.get_or("max-steps", 200)?;
    if max_steps == 0 {
        return Err("--max-steps must be at least 1".into());
    }
    Ok(Config {
        address: args.get("address")?.ok_or_else(|| format!("--address is required\n{USAGE}"))?,
        episodes: args.get_or("episodes", 3)?,
        max_steps,
        seed: args.get_or("seed", 0)?,
        episode_prefix: args.get("episode-prefix")?,
        options: ClientOptions {
            token: args.get("token")?,
            io_timeout: Some(Duration::from_secs_f64(timeout_s)),
            connect_timeout: Duration::from_secs_f64(timeout_s.min(10.0)),
            ..ClientOptions::default()
        },
    })
}

fn json_obs(obs: &[f32; OBS_DIM]) -> String {
    let items: Vec<String> = obs.iter().map(|&v| json_number(f64::from(v))).collect();
    format!("[{}]", items.join(","))
}

fn run(cfg: &Config) -> Result<(), Box<dyn std::error::Error>> {
    let mut client = PolicyClient::connect(cfg.address.as_str(), &cfg.options)?;
    let mut env = CartPole::new(cfg.seed);
    let stdout = std::io::stdout();
    for n in 0..cfg.episodes {
        let wanted_id = cfg.episode_prefix.as_ref().map(|p| format!("{p}-{n}"));
        let episode_id = client.start_episode(wanted_id.as_deref(), true)?;
        let mut obs = env.reset();
        let mut observations = vec![obs];
        let mut actions = Vec::new();
        let (mut ret, mut terminated) = (0.0, false);
        while !terminated && actions.len() < cfg.max_steps as usize {
            let action = client.get_action(&episode_id, NdArray::vector_f32(&obs))?;
            let a = action.as_discrete().ok_or_else(|| format!("not a Discrete(2) action: {action:?}"))?;
            let step = env.step(a)?;
            client.log_returns(&episode_id, step.reward, None)?;
            actions.push(a);
            ret += step.reward;
            terminated = step.terminated;
            obs = step.observation;
            observations.push(obs);
        }
        client.end_episode(&episode_id, NdArray::vector_f32(&obs))?;
        let actions: Vec<String> = actions.iter().map(i64::to_string).collect();
        let observations: Vec<String> = observations.iter().map(json_obs).collect();
        let line = format!(
            "{{\"episode_id\":{},\"length\":{},\"return\":{},\"terminated\":{},\"truncated\":{},\"actions\":[{}],\"observations\":[{}]}}",
            json_string(&episode_id),
            actions.len(),
            json_number(ret),
            terminated,
            !terminated,
            actions.join(","),
            observations.join(","),
        );
        let mut out = stdout.lock();
        writeln!(out, "{line}")?;
        out.flush()?;
    }
    Ok(())
}

fn main() -> ExitCode {
    let cfg = match config() {
        Ok(cfg) => cfg,
        Err(msg) => {
            eprintln!("cartpole_client: {msg}");
            return ExitCode::from(2);
        }
    };
    match run(&cfg) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cartpole_client: {e}");
            ExitCode::FAILURE
        }
    }
}
