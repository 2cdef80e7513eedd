//! Criterion benches of the metrics core: one push per reduction, peek of a 100-value
//! window, reduce of a runner's typical stats, and merging the reductions of 8 runners.
//! Run with `make bench-rust` (`cargo bench --bench metrics`).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use fastrollout::metrics::{Config, Payload, Reduce, Stat};

const WINDOW: usize = 100;

fn stat(reduce: Reduce, window: Option<usize>) -> Stat<()> {
    Stat::new(Config { window, ..Config::new(reduce) }, false, true, 0.0)
}

/// The stats an env runner keeps (RLlib's SingleAgentEnvRunner metrics).
fn runner_stats() -> Vec<Stat<()>> {
    let mut stats = vec![
        stat(Reduce::Mean, Some(WINDOW)),
        stat(Reduce::Min, Some(WINDOW)),
        stat(Reduce::Max, Some(WINDOW)),
        stat(Reduce::Sum, None),
        stat(Reduce::LifetimeSum, None),
        stat(Reduce::Ema, None),
        stat(Reduce::Percentiles, Some(WINDOW)),
    ];
    for (i, s) in stats.iter_mut().enumerate() {
        for v in 0..WINDOW {
            s.push((v * 7 + i) as f64 % 13.0).expect("push");
        }
    }
    stats
}

fn bench_push(c: &mut Criterion) {
    let mut g = c.benchmark_group("metrics push");
    for (name, reduce, window) in [
        ("ema", Reduce::Ema, None),
        ("mean window=100", Reduce::Mean, Some(WINDOW)),
        ("mean", Reduce::Mean, None),
        ("min window=100", Reduce::Min, Some(WINDOW)),
        ("sum", Reduce::Sum, None),
        ("lifetime_sum", Reduce::LifetimeSum, None),
        ("percentiles window=100", Reduce::Percentiles, Some(WINDOW)),
    ] {
        let mut s = stat(reduce, window);
        let mut x = 0.0f64;
        g.bench_function(name, |b| {
            b.iter(|| {
                x = (x + 0.37) % 10.0;
                s.push(black_box(x)).expect("push");
            });
        });
    }
    g.finish();
}

fn bench_peek_reduce_merge(c: &mut Criterion) {
    let mut g = c.benchmark_group("metrics peek/reduce/merge");
    for (name, reduce) in [("mean", Reduce::Mean), ("max", Reduce::Max), ("percentiles", Reduce::Percentiles)]
    {
        let mut s = stat(reduce, Some(WINDOW));
        for v in 0..WINDOW {
            s.push(v as f64).expect("push");
        }
        g.bench_function(format!("peek {name} window=100"), |b| {
            b.iter(|| {
                let p = s.peek(true, false);
                black_box(&p);
            });
        });
    }
    g.bench_function("reduce runner stats (7 stats, 100 values each)", |b| {
        b.iter_batched(
            runner_stats,
            |mut stats| stats.iter_mut().map(|s| s.reduce(1.0)).collect::<Vec<Payload<()>>>(),
            criterion::BatchSize::SmallInput,
        );
    });
    let payloads: Vec<Vec<Payload<()>>> =
        (0..8).map(|_| runner_stats().iter_mut().map(|s| s.reduce(1.0)).collect()).collect();
    g.bench_function("merge 8 runners' reductions (7 stats)", |b| {
        b.iter_batched(
            || runner_stats().into_iter().map(|s| Stat::aggregator(s.config().clone(), true, 0.0)).collect(),
            |mut roots: Vec<Stat<()>>| {
                for (k, root) in roots.iter_mut().enumerate() {
                    let incoming: Vec<&Payload<()>> = payloads.iter().map(|p| &p[k]).collect();
                    root.merge(&incoming).expect("merge");
                }
                roots
            },
            criterion::BatchSize::SmallInput,
        );
    });
    g.finish();
}

criterion_group!(benches, bench_push, bench_peek_reduce_merge);
criterion_main!(benches);
