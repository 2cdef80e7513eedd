//! Criterion benches of the runner's batched containers (pure core): splitting a vector
//! step's batch into rows and recording them into N episodes, and gathering per-module
//! inference batches across sub-envs and agents with the scatter plan back. Run with
//! `cargo bench --bench runner`.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use fastrollout::episode::{Field, Item, Leaves, SingleAgentCore, Step, TypedItem};
use fastrollout::runner::{scatter_plan, EnvIndices, ModuleBatch, Rows};
use fastrollout::schema::{DType, Leaf, Schema};

const OBS: usize = 4;

fn obs_schema() -> Schema {
    Schema::new(vec![Leaf::new(DType::F32, vec![OBS])])
}

fn scalar(dtype: DType) -> Schema {
    Schema::new(vec![Leaf::new(dtype, vec![])])
}

fn no_object(_: TypedItem<'_>) {}

fn episode() -> SingleAgentCore<()> {
    let mut e = SingleAgentCore::<()> {
        observations: Field::typed(obs_schema(), false),
        actions: Field::typed(scalar(DType::I64), false),
        rewards: Field::typed(scalar(DType::F64), false),
        extra_model_outputs: vec![("action_logp".into(), Field::typed(scalar(DType::F32), false))],
        ..SingleAgentCore::default()
    };
    e.add_reset(Item::Bytes(Leaves::One(vec![0u8; OBS * 4])), None, no_object).expect("reset");
    e
}

/// One vector step of `n` CartPole-like sub-envs: rows of the batches into n episodes.
fn bench_record_vector_step(c: &mut Criterion) {
    let mut g = c.benchmark_group("record_vector_step");
    for n in [1usize, 8, 64] {
        let obs = vec![1u8; n * OBS * 4];
        let act = vec![0u8; n * 8];
        let rew = vec![0u8; n * 8];
        let logp = vec![0u8; n * 4];
        let (so, sa, sr, sl) = (obs_schema(), scalar(DType::I64), scalar(DType::F64), scalar(DType::F32));
        g.throughput(Throughput::Elements(n as u64));
        g.bench_function(format!("{n}_sub_envs"), |b| {
            let mut eps: Vec<_> = (0..n).map(|_| episode()).collect();
            b.iter(|| {
                if eps[0].len() >= 4096 {
                    eps = (0..n).map(|_| episode()).collect();
                }
                let rows = [
                    Rows::new(&so, &[&obs], n).expect("obs"),
                    Rows::new(&sa, &[&act], n).expect("act"),
                    Rows::new(&sr, &[&rew], n).expect("rew"),
                    Rows::new(&sl, &[&logp], n).expect("logp"),
                ];
                for (i, e) in eps.iter_mut().enumerate() {
                    let r = |k: usize| Item::Bytes(rows[k].row(i).expect("row").into());
                    let step = Step {
                        observation: r(0),
                        action: r(1),
                        reward: r(2),
                        info: None,
                        extra_model_outputs: vec![("action_logp", r(3))],
                        terminated: false,
                        truncated: false,
                    };
                    e.add_step(step, no_object).expect("step");
                }
                black_box(&eps);
            });
        });
    }
    g.finish();
}

/// The same vector step through the runners' fast path: each episode checks the batch
/// layouts once (`fits_rows`) and stores its row as raw bytes (`add_row_step`).
fn bench_record_raw_rows(c: &mut Criterion) {
    let mut g = c.benchmark_group("record_raw_rows");
    for n in [1usize, 8, 64, 1024] {
        let batches = [vec![1u8; n * OBS * 4], vec![0u8; n * 8], vec![0u8; n * 8], vec![0u8; n * 4]];
        let widths = [OBS * 4, 8, 8, 4];
        g.throughput(Throughput::Elements(n as u64));
        g.bench_function(format!("{n}_sub_envs"), |b| {
            let mut eps: Vec<_> = (0..n).map(|_| episode()).collect();
            let schemas: Vec<Schema> = (0..4)
                .map(|k| {
                    [obs_schema(), scalar(DType::I64), scalar(DType::F64), scalar(DType::F32)][k].clone()
                })
                .collect();
            let layouts: Vec<&Schema> = schemas.iter().collect();
            b.iter(|| {
                if eps[0].len() >= 4096 {
                    eps = (0..n).map(|_| episode()).collect();
                }
                for (i, e) in eps.iter_mut().enumerate() {
                    assert!(e.fits_rows(&layouts, &["action_logp"]));
                    let row: Vec<&[u8]> =
                        batches.iter().zip(widths).map(|(bytes, w)| &bytes[i * w..(i + 1) * w]).collect();
                    e.add_row_step(&row, &["action_logp"], None, false, false).expect("step");
                }
                black_box(&eps);
            });
        });
    }
    g.finish();
}

/// Gather of `envs` x `agents` observations into two modules, and the scatter plan back.
fn bench_gather_scatter(c: &mut Criterion) {
    let mut g = c.benchmark_group("gather_scatter");
    for (envs, agents) in [(1usize, 2usize), (8, 2), (8, 8), (64, 8)] {
        let item = vec![vec![3u8; OBS * 4]];
        g.throughput(Throughput::Elements((envs * agents) as u64));
        g.bench_function(format!("{envs}_envs_x_{agents}_agents"), |b| {
            let mut batches = [ModuleBatch::new(obs_schema()), ModuleBatch::new(obs_schema())];
            b.iter(|| {
                for mb in &mut batches {
                    mb.clear();
                }
                for env in 0..envs {
                    for agent in 0..agents {
                        batches[agent % 2].push(env, agent, &item).expect("push");
                    }
                }
                for mb in &batches {
                    black_box(scatter_plan(mb.index(), envs));
                    black_box(mb.leaf(0));
                }
            });
        });
    }
    g.finish();
}

/// The sub-envs of a step: `k` of `n` (every third, wrapping), given as indices, or all `n`
/// without indices (`k == n` and `given == false`: the runner's default call).
fn env_indices(k: usize, n: usize, given: bool) -> EnvIndices {
    if !given {
        return EnvIndices::all(n);
    }
    let idx: Vec<i64> = (0..k).map(|j| ((j * 3) % n) as i64).collect();
    EnvIndices::subset(&idx, n).expect("distinct when gcd(3, n) == 1")
}

/// Cases of the subset benches: (sub-envs stepped, of, indices given).
const SUBSETS: [(usize, usize, bool); 4] = [(3, 8, true), (8, 8, true), (8, 8, false), (64, 64, true)];

fn subset_name(k: usize, n: usize, given: bool) -> String {
    if given {
        format!("{k}_of_{n}_env_indices")
    } else {
        format!("{n}_of_{n}_all")
    }
}

/// The fast-path record of a step of `k` of `n` sub-envs: the indices are checked (part of
/// each call), then row `j` of the k-row batches goes into episode `env_indices[j]`.
fn bench_record_subset_rows(c: &mut Criterion) {
    let mut g = c.benchmark_group("record_subset_rows");
    let schemas = [obs_schema(), scalar(DType::I64), scalar(DType::F64), scalar(DType::F32)];
    let layouts: Vec<&Schema> = schemas.iter().collect();
    let widths = [OBS * 4, 8, 8, 4];
    for (k, n, given) in SUBSETS {
        let batches = [vec![1u8; k * OBS * 4], vec![0u8; k * 8], vec![0u8; k * 8], vec![0u8; k * 4]];
        g.throughput(Throughput::Elements(k as u64));
        g.bench_function(subset_name(k, n, given), |b| {
            let mut eps: Vec<_> = (0..n).map(|_| episode()).collect();
            b.iter(|| {
                if eps[0].len() >= 4096 {
                    eps = (0..n).map(|_| episode()).collect();
                }
                let envs = env_indices(k, n, given);
                for (j, env) in envs.iter() {
                    let e = &mut eps[env];
                    assert!(e.fits_rows(&layouts, &["action_logp"]));
                    let row: Vec<&[u8]> =
                        batches.iter().zip(widths).map(|(bytes, w)| &bytes[j * w..(j + 1) * w]).collect();
                    e.add_row_step(&row, &["action_logp"], None, false, false).expect("step");
                }
                black_box(&eps);
            });
        });
    }
    g.finish();
}

/// Gather of 8 agents per sub-env of a step of `k` of `n` sub-envs into two modules, with
/// the scatter plan back (one entry per gathered sub-env) and each row's episode index.
fn bench_gather_subset(c: &mut Criterion) {
    let mut g = c.benchmark_group("gather_subset");
    let agents = 8;
    let item = vec![vec![3u8; OBS * 4]];
    for (k, n, given) in SUBSETS {
        g.throughput(Throughput::Elements((k * agents) as u64));
        g.bench_function(format!("{}_x_{agents}_agents", subset_name(k, n, given)), |b| {
            let mut batches = [ModuleBatch::new(obs_schema()), ModuleBatch::new(obs_schema())];
            b.iter(|| {
                let envs = env_indices(k, n, given);
                for mb in &mut batches {
                    mb.clear();
                }
                for (row, _) in envs.iter() {
                    for agent in 0..agents {
                        batches[agent % 2].push(row, agent, &item).expect("push");
                    }
                }
                for mb in &batches {
                    black_box(scatter_plan(mb.index(), envs.len()));
                    black_box(mb.index().iter().map(|&(row, _)| envs.env(row)).sum::<usize>());
                    black_box(mb.leaf(0));
                }
            });
        });
    }
    g.finish();
}

criterion_group!(
    benches,
    bench_record_vector_step,
    bench_record_raw_rows,
    bench_gather_scatter,
    bench_record_subset_rows,
    bench_gather_subset
);
criterion_main!(benches);
