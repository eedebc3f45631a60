//! Plugging your own candle model into the data-parallel runtime: cut it into stages with
//! [`Stages`], then every rank runs forward, the stage-by-stage backward whose gradients go
//! straight to the [`Reducer`] (communication overlaps the rest of backward), and an
//! optimizer step. Run: `cargo run -p pipeline --example own_model`.

use candle_core::{Device, Module, Tensor};
use collectives::{Communicator, ThreadComm};
use pipeline::optimizer::{self, OptimizerKind};
use pipeline::staged::{self, Staged, Stages};
use pipeline::{MergePlan, Reducer, TopkAllgather};

/// Your model: any candle modules, one stage each (here a two-layer perceptron).
fn my_model(seed: u64) -> pipeline::Result<Stages> {
    let mut m = Stages::new("my_mlp", seed);
    m.push("hidden", |vb| {
        let l = candle_nn::linear(16, 32, vb)?;
        Ok(candle_nn::func_t(move |x, _train| l.forward(x)?.relu()))
    })?;
    m.push("out", |vb| candle_nn::linear(32, 4, vb))?;
    Ok(m)
}

fn main() -> pipeline::Result<()> {
    let losses = ThreadComm::run(2, |comm| -> pipeline::Result<Vec<f32>> {
        let rank = comm.rank();
        let model = my_model(7)?;
        let layers = staged::layers(&model);
        let sizes = staged::layer_sizes(&model);
        let ctrl = comm.split(0, rank as u32)?;
        let named: Vec<(String, usize)> = layers
            .iter()
            .map(|(n, _)| n.clone())
            .zip(sizes.iter().copied())
            .collect();
        let mut opt = optimizer::build(OptimizerKind::Sgd, &*ctrl, &named, 0.9, 1e-4)?;
        // Top-k (density 0.25) with error feedback, layer-wise groups.
        let scheme = TopkAllgather { density: 0.25 };
        let mut reducer = Reducer::new(comm, &sizes, MergePlan::layerwise(sizes.len()), &scheme)?;
        let mut weights = staged::get_params(&model)?;
        // Each rank its own data: the class is the index of the largest of 4 features.
        let x = Tensor::randn(0f32, 1.0, (64, 16), &Device::Cpu)?;
        let y = x.narrow(1, 0, 4)?.argmax(1)?;
        let mut losses = Vec::new();
        for _ in 0..30 {
            reducer.begin()?;
            let fwd = staged::forward_train(&model, &x)?;
            let loss = model.loss(fwd.logits(), &y)?;
            reducer.forward_done()?;
            staged::backward_staged(&model, &fwd, &loss, &mut |l, g| reducer.ready(l, g))?;
            let grads = reducer.finish()?;
            opt.step(&*ctrl, &mut weights, &grads, 0.1)?;
            staged::set_params(&model, &weights)?;
            losses.push(loss.to_scalar::<f32>()?);
        }
        Ok(losses)
    })
    .map_err(|e| pipeline::Error::CommThread(e.to_string()))?;
    let l = &losses[0];
    println!("rank 0 loss: first {:.3}, last {:.3}", l[0], l[l.len() - 1]);
    Ok(())
}
