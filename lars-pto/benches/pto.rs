//! LARS and LAMB coefficient computation per step, with the parallel tensor operator
//! (each rank computes its layers, then all-gather) and without it (every rank computes
//! every layer), for the ResNet-50 and BERT-base tensor sizes at P = 1, 2, 4, 8 on
//! `ThreadComm`. The P rank threads stay alive across iterations; the time is rank 0's,
//! all-gather included; each rank has its own copy of the inputs unless P copies exceed the
//! budget of `lars_pto::bench_support::copy_budget_bytes` (see that module).
//!
//! Filter like any criterion bench, e.g. `cargo bench -p lars-pto --bench pto -- p4`.

use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use lars_pto::bench_support::{
    bert_base_numels, resnet50_numels, BenchWorld, ModelData, Optimizer,
};
use lars_pto::Mode;

fn bench(c: &mut Criterion) {
    let models: [(&str, Vec<usize>); 2] = [
        ("resnet50", resnet50_numels()),
        ("bert-base", bert_base_numels()),
    ];
    for opt in [Optimizer::Lars, Optimizer::Lamb] {
        for (model, numels) in &models {
            // Built lazily so that a filtered run does not pay for data it does not use.
            let mut data: Option<Arc<ModelData>> = None;
            let mut group = c.benchmark_group(format!("{}/{model}", opt.name()));
            group.sample_size(10);
            group.warm_up_time(Duration::from_secs(1));
            group.measurement_time(Duration::from_secs(4));
            group.throughput(Throughput::Elements(numels.iter().sum::<usize>() as u64));
            for p in [1usize, 2, 4, 8] {
                let mut noted = false;
                for (name, mode) in [("pto", Mode::Parallel), ("local", Mode::Local)] {
                    let id = BenchmarkId::new(name, format!("p{p}"));
                    group.bench_function(id, |b| {
                        let d = data
                            .get_or_insert_with(|| Arc::new(ModelData::new(numels, opt, 1)))
                            .clone();
                        let world = BenchWorld::new(p, d, opt, mode).expect("bench world");
                        if !world.per_rank_copies() && p > 1 && !noted {
                            eprintln!("note: {model} p{p}: ranks share one copy of the inputs");
                            noted = true;
                        }
                        b.iter_custom(|iters| world.run(iters).expect("bench step"));
                    });
                }
            }
            group.finish();
        }
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
