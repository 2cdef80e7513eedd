//! Criterion benches of the pure core: column append, single- and multi-agent add_env_step,
//! cut and the to_numpy gather, and the runners' categorical draw. Run with `make bench-rust` (`cargo bench --bench core`); compare
//! against a saved baseline with `cargo bench --bench core -- --baseline main`.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use fastrollout::column::{Column, Index, Pos, Resolved};
use fastrollout::episode::{Field, Item, Leaves, SingleAgentCore, Step, TypedItem};
use fastrollout::schema::{DType, Leaf, Schema};

const CARTPOLE_OBS: usize = 4;

fn obs_schema(numel: usize, dtype: DType) -> Schema {
    Schema::new(vec![Leaf::new(dtype, vec![numel])])
}

fn scalar(dtype: DType) -> Schema {
    Schema::new(vec![Leaf::new(dtype, vec![])])
}

fn no_object(_: TypedItem<'_>) {}

fn episode(obs_numel: usize, obs_dtype: DType) -> SingleAgentCore<()> {
    let mut e = SingleAgentCore::<()> {
        observations: Field::typed(obs_schema(obs_numel, obs_dtype), false),
        actions: Field::typed(scalar(DType::I64), false),
        rewards: Field::typed(scalar(DType::F64), true),
        extra_model_outputs: vec![("action_logp".into(), Field::typed(scalar(DType::F32), false))],
        ..SingleAgentCore::default()
    };
    let obs = vec![0u8; obs_numel * obs_dtype.size];
    e.add_reset(Item::Bytes(Leaves::One(obs)), None, no_object).expect("reset");
    e
}

fn step(obs: &[u8]) -> Step<'static, ()> {
    Step {
        observation: Item::Bytes(Leaves::One(obs.to_vec())),
        action: Item::Bytes(Leaves::One(1i64.to_ne_bytes().to_vec())),
        reward: Item::Bytes(Leaves::One(1f64.to_ne_bytes().to_vec())),
        info: None,
        extra_model_outputs: vec![(
            "action_logp",
            Item::Bytes(Leaves::One((-0.7f32).to_ne_bytes().to_vec())),
        )],
        terminated: false,
        truncated: false,
    }
}

fn bench_column_append(c: &mut Criterion) {
    let mut g = c.benchmark_group("column_append");
    for (name, numel, dtype) in [
        ("cartpole_f32x4", CARTPOLE_OBS, DType::F32),
        ("atari_u8x84x84x4", 84 * 84 * 4, DType { kind: fastrollout::schema::Kind::UInt, size: 1 }),
    ] {
        let item = vec![7u8; numel * dtype.size];
        g.throughput(Throughput::Bytes(item.len() as u64));
        g.bench_function(name, |b| {
            let mut col = Column::new(obs_schema(numel, dtype));
            b.iter(|| {
                if col.total() >= 4096 {
                    // Steady state of a runner: keep look-back, reuse storage.
                    col.recycle_keep_tail(1);
                }
                col.push(&[black_box(&item)]).expect("push");
            });
        });
    }
    g.finish();
}

fn bench_add_env_step(c: &mut Criterion) {
    let obs = vec![0u8; CARTPOLE_OBS * 4];
    c.bench_function("single_agent/add_env_step", |b| {
        b.iter_batched_ref(
            || episode(CARTPOLE_OBS, DType::F32),
            |e| {
                for _ in 0..200 {
                    e.add_step(step(black_box(&obs)), no_object).expect("step");
                }
            },
            BatchSize::SmallInput,
        );
    });
}

fn filled(steps: usize) -> SingleAgentCore<()> {
    let obs = vec![0u8; CARTPOLE_OBS * 4];
    let mut e = episode(CARTPOLE_OBS, DType::F32);
    for _ in 0..steps {
        e.add_step(step(&obs), no_object).expect("step");
    }
    e
}

fn bench_cut_and_gather(c: &mut Criterion) {
    let e = filled(200);
    c.bench_function("single_agent/cut_lookback_1", |b| b.iter(|| black_box(&e).cut(1).expect("cut")));
    c.bench_function("single_agent/to_numpy_gather_200_steps", |b| {
        b.iter(|| {
            // What to_numpy + reading every column costs: one gather per leaf.
            let mut total = 0;
            for field in [&e.observations, &e.actions, &e.rewards] {
                let Resolved::Many(pos) = field.resolve(&Index::All, false, false).expect("resolve") else {
                    unreachable!()
                };
                if let fastrollout::episode::Storage::Typed { column, .. } = &field.storage {
                    total += column.gather(0, black_box(&pos), None, false).len();
                }
            }
            total
        });
    });
    let pos: Vec<Pos> = (0..200).map(Pos::At).collect();
    if let fastrollout::episode::Storage::Typed { column, .. } = &e.observations.storage {
        c.bench_function("column/gather_200_f32x4", |b| {
            b.iter(|| column.gather(0, black_box(&pos), None, false));
        });
    }
}

/// One simultaneous env step of every agent through the core: the env step's plan, then
/// each agent's record and step-map entry as the plan says.
fn multi_agent_env_step(
    agents: &mut [SingleAgentCore<()>],
    maps: &mut [fastrollout::episode::multi::StepMap],
    env_t: i64,
    obs: &[u8],
) {
    use fastrollout::episode::multi::{plan_env_step, AgentStep, AgentStepInput, EnvStep, MapWrite};
    let steps: Vec<AgentStep> = agents
        .iter()
        .map(|a| AgentStep {
            input: AgentStepInput {
                has_observation: true,
                has_action: true,
                has_reward: true,
                has_any_data: true,
                has_episode: true,
                has_step_map: true,
                ..AgentStepInput::default()
            },
            agent_len: a.len(),
            t_started: Some(a.t_started),
        })
        .collect();
    let rewards = vec![1.0; agents.len()];
    let env_step =
        EnvStep { agents: &steps, terminated: false, truncated: false, env_t, env_t_started: 0, lookback: 0 };
    let plan = plan_env_step(black_box(&env_step), &rewards).expect("plan");
    for ((agent, map), outcome) in agents.iter_mut().zip(maps.iter_mut()).zip(&plan.agents) {
        agent.add_step(step(obs), no_object).expect("step");
        if let MapWrite::Step(t) = outcome.map {
            map.push(Some(t));
        }
    }
}

/// The core's share of a multi-agent env step: plan the env step for every agent, record
/// each agent's step in its episode and extend its env-step map (what
/// `MultiAgentEpisode.add_env_step` does natively), then cut every agent at the rollout
/// boundary.
fn bench_multi_agent(c: &mut Criterion) {
    use fastrollout::episode::multi::StepMap;
    let obs = vec![0u8; CARTPOLE_OBS * 4];
    for n_agents in [2usize, 8] {
        c.bench_function(&format!("multi_agent/{n_agents}_agents/100_steps_then_cut"), |b| {
            b.iter_batched_ref(
                || {
                    let agents: Vec<_> = (0..n_agents).map(|_| episode(CARTPOLE_OBS, DType::F32)).collect();
                    let maps: Vec<StepMap> = (0..n_agents).map(|_| StepMap::new(vec![Some(0)], 0)).collect();
                    (agents, maps)
                },
                |(agents, maps)| {
                    for env_t in 0..100 {
                        multi_agent_env_step(agents, maps, env_t, &obs);
                    }
                    for agent in agents.iter() {
                        black_box(agent.cut(1).expect("cut"));
                    }
                },
                BatchSize::SmallInput,
            );
        });
    }
}

/// The core's share of one multi-agent env step alone (plan + record + step map for every
/// agent, in steady state), and of `MultiAgentEpisode.to_numpy` of a 100-step chunk (one
/// gather per leaf of every agent's observations, actions and rewards).
fn bench_multi_agent_step_and_to_numpy(c: &mut Criterion) {
    use fastrollout::episode::multi::StepMap;
    let obs = vec![0u8; CARTPOLE_OBS * 4];
    for n_agents in [2usize, 8] {
        // Steady state: the same agents step on (their columns already grown), and every
        // 100 steps each is cut (untimed), as a runner's chunks are; timing fresh episodes
        // instead would time their first appends' allocations.
        c.bench_function(&format!("multi_agent/{n_agents}_agents/add_env_step"), |b| {
            let mut agents: Vec<_> = (0..n_agents).map(|_| episode(CARTPOLE_OBS, DType::F32)).collect();
            let mut maps: Vec<StepMap> = (0..n_agents).map(|_| StepMap::new(vec![Some(0)], 0)).collect();
            for env_t in 0..100 {
                multi_agent_env_step(&mut agents, &mut maps, env_t, &obs);
            }
            b.iter_custom(|iters| {
                let mut timed = std::time::Duration::ZERO;
                let mut done = 0;
                while done < iters {
                    agents = agents.iter().map(|a| a.cut(1).expect("cut")).collect();
                    maps = agents.iter().map(|a| StepMap::new(vec![Some(a.t)], 1)).collect();
                    let batch = (iters - done).min(100);
                    let start = std::time::Instant::now();
                    for env_t in 0..batch {
                        multi_agent_env_step(&mut agents, &mut maps, env_t as i64, &obs);
                    }
                    timed += start.elapsed();
                    done += batch;
                }
                timed
            });
        });
        let agents: Vec<_> = (0..n_agents).map(|_| filled(100)).collect();
        c.bench_function(&format!("multi_agent/{n_agents}_agents/to_numpy_gather_100_steps"), |b| {
            b.iter(|| {
                let mut total = 0;
                for e in black_box(&agents) {
                    for field in [&e.observations, &e.actions, &e.rewards] {
                        let Resolved::Many(pos) = field.resolve(&Index::All, false, false).expect("resolve")
                        else {
                            unreachable!()
                        };
                        if let fastrollout::episode::Storage::Typed { column, .. } = &field.storage {
                            total += column.gather(0, &pos, None, false).len();
                        }
                    }
                }
                total
            });
        });
    }
}

fn bench_categorical_draw(c: &mut Criterion) {
    let mut g = c.benchmark_group("categorical_draw");
    for (rows, categories) in [(8, 2), (1024, 2), (1024, 18)] {
        #[allow(clippy::cast_precision_loss)]
        let logits: Vec<f32> = (0..rows * categories).map(|i| (i % 7) as f32 * 0.3 - 1.0).collect();
        #[allow(clippy::cast_precision_loss)]
        let uniforms: Vec<f64> = (0..rows).map(|i| (i as f64 + 0.5) / rows as f64).collect();
        let mut actions = vec![0i64; rows];
        let mut logp = vec![0f32; rows];
        g.throughput(Throughput::Elements(rows as u64));
        g.bench_function(format!("{rows}x{categories}"), |b| {
            b.iter(|| {
                fastrollout::dist::categorical_draw(
                    black_box(&logits),
                    categories,
                    black_box(&uniforms),
                    &mut actions,
                    &mut logp,
                )
                .expect("draw");
            });
        });
    }
    g.finish();
}

/// 84x84 grayscale frame `t` of a deterministic scene: three squares bouncing over a
/// vertical gradient and a striped floor (what `SyntheticImageEnv(frames="scene")` draws).
fn scene_frame(t: usize) -> Vec<u8> {
    let mut f: Vec<u8> = (0..84 * 84)
        .map(|k| {
            let (y, x) = (k / 84, k % 84);
            if y >= 70 {
                120 + 30 * ((x / 6) % 2) as u8
            } else {
                40 + (y * 100 / 84) as u8
            }
        })
        .collect();
    let bounce = |p: usize, span: usize| {
        let p = p % (2 * span);
        if p > span {
            2 * span - p
        } else {
            p
        }
    };
    for (i, (size, vx, vy, c)) in [(10, 2, 3, 200u8), (6, 3, 1, 90), (8, 1, 2, 160)].into_iter().enumerate() {
        let (x, y) = (bounce(i * 17 + vx * t, 84 - size), bounce(i * 29 + vy * t, 84 - size));
        for row in y..y + size {
            f[row * 84 + x..row * 84 + x + size].fill(c);
        }
    }
    f
}

/// 84x84x4 frame stacks (the last 4 frames, channels last) of [`scene_frame`].
fn scene_stacks(n: usize) -> Vec<Vec<u8>> {
    let frames: Vec<Vec<u8>> = (0..n + 3).map(scene_frame).collect();
    (0..n).map(|t| (0..84 * 84 * 4).map(|k| frames[t + k % 4][k / 4]).collect()).collect()
}

/// Observation compression (`Column::set_compression`): bytes held per 84x84x4 step of a
/// structured scene, the time per append and per to_numpy gather, plain against LZ4 blocks.
fn bench_compressed_observations(c: &mut Criterion) {
    let u8_ = DType { kind: fastrollout::schema::Kind::UInt, size: 1 };
    let rows = scene_stacks(256);
    let all: Vec<Pos> = (0..256).map(Pos::At).collect();
    for (name, compression) in [("plain", None), ("lz4_32", Some(fastrollout::column::DEFAULT_BLOCK_ROWS))] {
        let mut col = Column::new(obs_schema(84 * 84 * 4, u8_));
        col.set_compression(compression);
        for r in rows.iter().cycle().take(1024) {
            col.push(&[r]).expect("push");
        }
        eprintln!(
            "compressed_obs/{name}: {:.0} bytes per stored step over 1024 steps (raw {})",
            col.stored_bytes() as f64 / 1024.0,
            84 * 84 * 4
        );
        let mut g = c.benchmark_group("compressed_obs");
        g.throughput(Throughput::Bytes(84 * 84 * 4));
        g.bench_function(format!("append_atari_scene/{name}"), |b| {
            let mut col = Column::new(obs_schema(84 * 84 * 4, u8_));
            col.set_compression(compression);
            let mut i = 0;
            b.iter(|| {
                if col.total() >= 512 {
                    col.recycle_keep_tail(1);
                }
                col.push(&[black_box(&rows[i % 256])]).expect("push");
                i += 1;
            });
        });
        let mut filled = Column::new(obs_schema(84 * 84 * 4, u8_));
        filled.set_compression(compression);
        for r in &rows {
            filled.push(&[r]).expect("push");
        }
        if compression.is_some() {
            // A 50-step chunk handed out (51 observations): before, nothing of it was
            // sealed; `seal_all` compresses every item, then the first read of its last
            // observation decompresses the short last block.
            let mut chunk = Column::new(obs_schema(84 * 84 * 4, u8_));
            chunk.set_compression(compression);
            for r in rows.iter().take(51) {
                chunk.push(&[r]).expect("push");
            }
            g.throughput(Throughput::Bytes(51 * 84 * 84 * 4));
            g.bench_function("seal_all_51_steps/lz4_32", |b| {
                b.iter_batched(
                    || chunk.clone(),
                    |mut c| {
                        c.seal_all();
                        c
                    },
                    criterion::BatchSize::LargeInput,
                );
            });
            chunk.seal_all();
            g.throughput(Throughput::Bytes(84 * 84 * 4));
            g.bench_function("read_last_of_sealed_chunk/lz4_32", |b| {
                b.iter_batched(
                    || chunk.clone(),
                    |c| black_box(c.item(0, 50).len()),
                    criterion::BatchSize::LargeInput,
                );
            });
        }
        let mut out = vec![0u8; 256 * 84 * 84 * 4];
        g.throughput(Throughput::Bytes(out.len() as u64));
        g.bench_function(format!("to_numpy_gather_256_steps/{name}"), |b| {
            b.iter(|| assert!(black_box(&filled).gather_into(0, &all, None, false, &mut out)));
        });
        g.finish();
    }
}

criterion_group!(
    benches,
    bench_column_append,
    bench_add_env_step,
    bench_cut_and_gather,
    bench_multi_agent,
    bench_multi_agent_step_and_to_numpy,
    bench_categorical_draw,
    bench_compressed_observations
);
criterion_main!(benches);
